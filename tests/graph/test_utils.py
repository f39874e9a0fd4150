"""Graph helpers that large models lean on."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import qdeploy.graph.utils as graph_utils


@pytest.mark.parametrize("stored", ["raw_data", "float_data"])
def test_float32_chunks_hand_out_every_value_once_in_order(monkeypatch: pytest.MonkeyPatch, stored: str) -> None:
    monkeypatch.setattr(graph_utils, "CHUNK_VALUES", 7)  # pieces of 7 over 20 values: 7, 7, 6
    values = np.arange(20, dtype=np.float32).reshape(4, 5) - 3.5
    tensor = (numpy_helper.from_array(values, "w") if stored == "raw_data"
              else helper.make_tensor("w", TensorProto.FLOAT, values.shape, values.ravel().tolist()))
    chunks = list(graph_utils.float32_chunks(tensor))
    assert [chunk.size for chunk in chunks] == [7, 7, 6]
    np.testing.assert_array_equal(np.concatenate(chunks), values.ravel())
