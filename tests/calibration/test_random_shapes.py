"""Random data for an input with symbolic axes past the first (an image's height and width): they are 1, which a
convolution's kernel may not fit and a latency should not be measured on.  qdeploy says so once per input, and the
error of feeds that do not fit names their shapes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from qdeploy.calibration.readers import InputInfo, random_samples
from qdeploy.core.errors import DataError
from qdeploy.targets import get_target
from tests.helpers.logs import said_by


def test_symbolic_axes_past_the_first_are_said_once_per_input() -> None:
    image = InputInfo("only_here", (None, 3, None, None), np.dtype(np.float32))
    tokens = InputInfo("tokens", (None, 16), np.dtype(np.int64))  # only the batch axis is symbolic: nothing to say
    with said_by("qdeploy.calibration.readers") as said_here:
        for _ in range(3):
            (sample,) = random_samples([image, tokens], 1)
    assert sample["only_here"].shape == (1, 3, 1, 1)
    said = [message for message in said_here.messages if "random data for input" in message]
    assert said == ["random data for input 'only_here': its symbolic axes [2, 3] are 1 (shape ['N', 3, 1, 1]); give "
                    "them a size in model.inputs (shape: [...]) or feed a dataset"]


def test_feeds_that_do_not_fit_are_named_with_their_shapes(tmp_path: Path) -> None:
    weight = numpy_helper.from_array(np.ones((4, 3, 7, 7), np.float32), "w")
    graph = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, "h", "w"])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [weight])
    path = tmp_path / "conv.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)
    with get_target("ort:cpu").load(path) as session, pytest.raises(DataError, match=r"feeds \(x \[1, 3, 2, 2\]\)"):
        session.run({"x": np.zeros((1, 3, 2, 2), np.float32)})
