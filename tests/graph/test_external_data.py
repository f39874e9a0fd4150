"""Probes written from a model without copying it: one file, or a graph file plus one data file."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from qdeploy.graph.external_data import save_exposing


@pytest.mark.parametrize("external", [False, True])
def test_a_probe_exposes_inner_tensors_and_leaves_the_model_alone(tmp_path: Path, external: bool) -> None:
    weight = np.random.default_rng(0).standard_normal((32, 32)).astype(np.float32)  # 4 KB: goes to the data file
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Add", ["m", "b"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 32])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 32])],
        [numpy_helper.from_array(weight, "w"), numpy_helper.from_array(np.ones(32, np.float32), "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    before = model.SerializeToString()
    path = tmp_path / "probe.onnx"

    save_exposing(model, path, [helper.make_tensor_value_info("m", TensorProto.FLOAT, [2, 32])], external=external)

    assert model.SerializeToString() == before
    assert (tmp_path / "probe.onnx.data").exists() == external
    assert path.stat().st_size < weight.nbytes if external else path.stat().st_size > weight.nbytes
    x = np.random.default_rng(1).standard_normal((2, 32)).astype(np.float32)
    y, m = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(["y", "m"], {"x": x})
    np.testing.assert_allclose(m, x @ weight, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(y, x @ weight + 1, rtol=1e-5, atol=1e-5)
