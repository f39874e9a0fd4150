"""The sessions' public bound call: inputs bound once, outputs at their real shape, read back by name."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from qdeploy.targets import BoundCall, get_target
from tests.helpers.models import tiny_cnn

TARGETS = ("ort:cpu", "openvino:cpu")


@pytest.mark.parametrize("target", TARGETS)
def test_bound_call_runs_repeatedly_at_the_real_output_shape(tmp_path: Path, target: str) -> None:
    model = tiny_cnn()  # logits declared [1, 10] while the input below is made dynamic: a lying declaration
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "batch"
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    feeds = {"input": np.random.default_rng(0).standard_normal((4, 3, 16, 16)).astype(np.float32)}
    with get_target(target).load(path) as session:
        expected = session.run(feeds)
        bound = session.bind(feeds)
        assert type(bound) is not BoundCall  # the runtime's own binding, not the convert-every-call default
        for _ in range(3):  # ORT checks an output buffer kept from the previous run against the declaration
            bound.run()
        got = bound.outputs()
        assert got["logits"].shape == (4, 10)
        np.testing.assert_allclose(got["logits"], expected["logits"], rtol=1e-5, atol=1e-6)
        assert session.runtime_settings()  # read back from the loaded model


@pytest.mark.parametrize("target", TARGETS)
def test_an_output_listed_twice_is_read_once(tmp_path: Path, target: str) -> None:
    value = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 3])
    graph = helper.make_graph([helper.make_node("Neg", ["x"], ["y"])], "twice",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3])], [value, value])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path = tmp_path / "twice.onnx"
    onnx.save(model, path)
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    with get_target(target).load(path) as session:
        bound = session.bind({"x": x})
        bound.run()
        outputs = bound.outputs()
        assert list(outputs) == ["y"]
        np.testing.assert_array_equal(outputs["y"], -x)
