"""``quantized_nodes`` counts the nodes that run in integer, not every node that reads a dequantized tensor."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper

from qdeploy.stages import quantize
from qdeploy.stages.quantize import CalibrationRef, QuantizeConfig
from qdeploy.stages.quantize._common import quantized_node_counts
from tests.helpers.quantize import init, make_model, npy_folder, save_artifact, stage_context


def _conv_sigmoid_tanh_model() -> onnx.ModelProto:
    """Conv -> Sigmoid -> Conv -> Tanh -> Conv: the float activations sit between quantized Convs (a CRNN's
    gates are Sigmoid and Tanh)."""
    rng = np.random.default_rng(0)
    inits = [init(f"w{i}", rng.standard_normal((4, 4 if i else 3, 3, 3)) * 0.3) for i in range(3)]
    nodes = [helper.make_node("Conv", ["x", "w0"], ["c0"], pads=[1, 1, 1, 1]),
             helper.make_node("Sigmoid", ["c0"], ["s"]),
             helper.make_node("Conv", ["s", "w1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("Tanh", ["c1"], ["t"]),
             helper.make_node("Conv", ["t", "w2"], ["y"], pads=[1, 1, 1, 1])]
    return make_model(nodes, inits, {"x": [1, 3, 8, 8]}, {"y": [1, 4, 8, 8]})


def _ort_optimized_ops(path: Path, tmp_path: Path) -> dict[str, int]:
    """Op types of the graph ONNX Runtime runs (its QDQ node groups fused into QLinear ops)."""
    options = ort.SessionOptions()
    options.optimized_model_filepath = str(tmp_path / "ort_optimized.onnx")
    ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    ops: dict[str, int] = {}
    for node in onnx.load(options.optimized_model_filepath).graph.node:
        ops[node.op_type] = ops.get(node.op_type, 0) + 1
    return ops


def test_sigmoid_and_tanh_between_quantized_convs_count_only_where_they_run_in_integer(tmp_path: Path) -> None:
    folder = npy_folder(tmp_path, (3, 8, 8), 4, seed=1)
    config = QuantizeConfig(calibration=CalibrationRef(data="calib"))
    result = quantize.run(save_artifact(tmp_path, _conv_sigmoid_tanh_model()), config,
                          stage_context(tmp_path, {"calib": folder}))
    counts = result.findings.quantized_nodes
    assert counts.get("Conv") == 3
    assert "Tanh" not in counts  # it reads a dequantized tensor, and runs in float
    onnx.save(result.model, str(tmp_path / "quantized.onnx"))
    ran = _ort_optimized_ops(tmp_path / "quantized.onnx", tmp_path)
    assert ran.get("Tanh") == 1  # what ONNX Runtime runs: Tanh stays float
    assert counts.get("Sigmoid", 0) == ran.get("QLinearSigmoid", 0)  # Sigmoid counts only as QLinearSigmoid


def test_a_dequantized_input_without_a_quantized_output_is_float() -> None:
    # DQ -> Sigmoid -> graph output: no QLinearSigmoid without an output scale; DQ -> Tanh -> Q: no integer Tanh
    scale, zero = init("scale", 0.1), init("zero", 0, np.uint8)
    nodes = [helper.make_node("QuantizeLinear", ["x", "scale", "zero"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "scale", "zero"], ["xd"]),
             helper.make_node("Sigmoid", ["xd"], ["y"]),
             helper.make_node("Tanh", ["xd"], ["t"]),
             helper.make_node("QuantizeLinear", ["t", "scale", "zero"], ["tq"]),
             helper.make_node("DequantizeLinear", ["tq", "scale", "zero"], ["z"]),
             helper.make_node("Sigmoid", ["xd"], ["s2"]),
             helper.make_node("QuantizeLinear", ["s2", "scale", "zero"], ["s2q"]),
             helper.make_node("DequantizeLinear", ["s2q", "scale", "zero"], ["w"])]
    model = make_model(nodes, [scale, zero], {"x": [4]}, ["y", "z", "w"])
    assert quantized_node_counts(model) == {"Sigmoid": 1}  # only the Sigmoid between a DQ and a Q
