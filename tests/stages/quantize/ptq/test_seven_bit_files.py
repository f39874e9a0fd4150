"""int8's choice between whole builds leaves nothing in the stage's work folder, large builds included."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import qdeploy.graph.external_data
from qdeploy.stages.quantize.ptq._seven_bit import measure_builds


def _matmul(noise: float) -> onnx.ModelProto:
    """y = x @ W with a 64 x 64 weight (16 kB: above onnx's 1 kB threshold for external tensors), ``noise`` added."""
    weight = np.random.default_rng(0).normal(0, 1, (64, 64)) + np.random.default_rng(1).normal(0, noise, (64, 64))
    weight = weight.astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64])],
        [numpy_helper.from_array(weight, "w")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_large_builds_leave_no_data_file_behind(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Builds above protobuf's limit (every model, here) are saved with their weights beside them; the comparison
    removes both files.  Saved by onnx with no data file name, their data went to a uuid-named file nobody removed."""
    float_model = tmp_path / "float.onnx"
    onnx.save(_matmul(0.0), float_model)
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.setattr(qdeploy.graph.external_data, "PROTOBUF_SAFE_BYTES", 1000)
    builders = {"weights": lambda _kept: _matmul(0.0), "activations": lambda _kept: _matmul(0.1)}
    feeds = [{"x": np.random.default_rng(seed).normal(size=(1, 64)).astype(np.float32)} for seed in range(2)]

    measured, compared = measure_builds(builders, float_model, feeds, work)

    assert compared is None
    assert measured["weights"]["cosine"] == pytest.approx(1.0)
    assert 0.99 < measured["activations"]["cosine"] < 0.9999  # each build was measured, not the first twice
    assert sorted(path.name for path in work.iterdir()) == []
