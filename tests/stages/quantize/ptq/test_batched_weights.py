"""A MatMul whose constant B has rank above 2 (DeBERTa's relative-position keys once simplify folds them):
ORT's quantizers made it per channel along K and its int8 MatMul refused to run (``_ptq.batched_matmuls``)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from qdeploy.stages import quantize
from qdeploy.stages.quantize import QuantizeConfig
from tests.helpers.quantize import cosine, init, make_model, producers, run_ort, save_artifact, stage_context

FEED = {"x": np.random.default_rng(1).uniform(-2, 2, (4, 8, 16)).astype(np.float32)}


def batched_model() -> onnx.ModelProto:
    """x [4, 8, 16] @ B [4, 16, 32] (a constant) -> Relu, beside x @ W [16, 32] (2-D: stays per channel)."""
    nodes = [helper.make_node("MatMul", ["x", "b"], ["m"], name="bmm"),
             helper.make_node("MatMul", ["x", "w"], ["n"], name="mm"),
             helper.make_node("Add", ["m", "n"], ["s"], name="add"),
             helper.make_node("Relu", ["s"], ["y"], name="relu")]
    rng = np.random.default_rng(0)
    weights = [init("b", rng.standard_normal((4, 16, 32))), init("w", rng.standard_normal((16, 32)))]
    return make_model(nodes, weights, {"x": [4, 8, 16]}, {"y": [4, 8, 32]})


def _quantize(tmp_path: Path, mode: str) -> onnx.ModelProto:
    context = dataclasses.replace(stage_context(tmp_path, ranges={"x": (-2.0, 2.0)}), variant="int8",
                                  targets=("ort:cpu",))
    return quantize.run(save_artifact(tmp_path, batched_model()), QuantizeConfig(mode=mode), context).model


def _weight_scale(model: onnx.ModelProto, node_name: str) -> np.ndarray | None:
    """The scale of the DequantizeLinear that feeds the node its B; None when B is float."""
    node = next(node for node in model.graph.node if node.name.startswith(node_name))
    dequantize = producers(model).get(node.input[1])
    if dequantize is None or dequantize.op_type != "DequantizeLinear":
        return None
    scales = {init.name: numpy_helper.to_array(init) for init in model.graph.initializer}
    return scales[dequantize.input[1]]


@pytest.mark.parametrize("mode", ["ptq", "dynamic"])
def test_a_batched_constant_b_quantizes_to_a_model_onnx_runtime_runs(tmp_path: Path, mode: str) -> None:
    model = _quantize(tmp_path, mode)
    assert cosine(run_ort(model, FEED)[0], run_ort(batched_model(), FEED)[0]) > 0.99
    if mode == "ptq":
        assert _weight_scale(model, "bmm").size == 1  # per tensor
        assert _weight_scale(model, "mm").shape == (32,)  # the 2-D weight beside it keeps a scale per channel
    else:
        assert not any(node.name.startswith("bmm") and node.op_type == "MatMulInteger" for node in model.graph.node)
        assert any(node.name.startswith("mm") and node.op_type == "MatMulInteger" for node in model.graph.node)
