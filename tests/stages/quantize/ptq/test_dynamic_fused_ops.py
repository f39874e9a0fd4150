"""Dynamic int8 of a model ONNX Runtime's transformer optimizer fused: its Attention became QAttention, which
OpenVINO cannot read ("No conversion rule found for operations: com.microsoft.QAttention"), so the variant
failed wherever OpenVINO was a target.  Where OpenVINO may run the model, fused Attention stays float."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper

from qdeploy.stages import quantize
from qdeploy.stages.quantize import QuantizeConfig
from tests.helpers.quantize import cosine, init, make_model, run_ort, save_artifact, stage_context

HIDDEN, HEADS = 32, 4


def fused_attention_model() -> onnx.ModelProto:
    """x -> com.microsoft.Attention -> MatMul (the projection after it) -> y."""
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("Attention", ["x", "qkv_weight", "qkv_bias"], ["attended"], name="attention",
                              domain="com.microsoft", num_heads=HEADS),
             helper.make_node("MatMul", ["attended", "projection"], ["y"], name="project")]
    weights = [init("qkv_weight", rng.standard_normal((HIDDEN, 3 * HIDDEN)) / 6),
               init("qkv_bias", rng.standard_normal(3 * HIDDEN) / 10),
               init("projection", rng.standard_normal((HIDDEN, HIDDEN)) / 6)]
    return make_model(nodes, weights, {"x": [1, 8, HIDDEN]}, {"y": [1, 8, HIDDEN]}, domains=("com.microsoft",))


FEED = {"x": np.random.default_rng(1).uniform(-1, 1, (1, 8, HIDDEN)).astype(np.float32)}


@pytest.mark.parametrize(("targets", "fused_int8"), [(("ort:cpu",), True), (("ort:cpu", "openvino:cpu"), False),
                                                     (("openvino:cpu",), False)])
def test_dynamic_int8_keeps_fused_attention_float_where_openvino_runs_it(tmp_path: Path, targets: tuple[str, ...],
                                                                          fused_int8: bool) -> None:
    context = dataclasses.replace(stage_context(tmp_path, ranges={"x": (-1.0, 1.0)}), variant="int8",
                                  targets=targets)
    model = quantize.run(save_artifact(tmp_path, fused_attention_model()), QuantizeConfig(mode="dynamic"),
                         context).model
    ops = {node.op_type for node in model.graph.node}
    assert ("QAttention" in ops) is fused_int8
    assert "MatMulInteger" in ops or "DynamicQuantizeMatMul" in ops  # the projection is int8 either way
    assert cosine(run_ort(model, FEED)[0], run_ort(fused_attention_model(), FEED)[0]) > 0.99
    if not fused_int8:
        import openvino

        path = tmp_path / "int8.onnx"
        onnx.save(model, str(path))
        openvino.Core().read_model(str(path))  # the old build: OpConversionFailure on com.microsoft.QAttention


def test_a_build_that_quantizes_nothing_is_refused_with_why(tmp_path: Path) -> None:
    """Dynamic int8 of a convolutional model quantized no node (Conv is left out with int8 weights) and shipped the
    float model as 'int8', with 'identical outputs'."""
    from qdeploy.core.errors import StageError

    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["y"], name="relu")]
    model = make_model(nodes, [init("w", np.ones((4, 3, 3, 3)))], {"x": [1, 3, 8, 8]}, {"y": [1, 4, 8, 8]})
    context = dataclasses.replace(stage_context(tmp_path), variant="int8-dyn", targets=("ort:cpu",))
    with pytest.raises(StageError, match=r"nothing was quantized: .*\(the model's ops: Conv 1, Relu 1\).*mode ptq"):
        quantize.run(save_artifact(tmp_path, model), QuantizeConfig(mode="dynamic"), context)
