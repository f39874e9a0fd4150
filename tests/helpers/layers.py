"""Tiny models with known per-layer answers for the layers pass: a fusable Conv+BatchNormalization+Relu, a QDQ Conv
that ONNX Runtime cannot fuse (its output is not quantized), a chain whose middle Mul overflows float16."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

__all__ = ["conv_bn_relu", "overflow_chain", "unfusable_qdq_conv"]


def _model(nodes: list, inputs: list, outputs: list, inits: list, opset: int = 17) -> onnx.ModelProto:
    model = helper.make_model(helper.make_graph(nodes, "m", inputs, outputs, inits),
                              opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def conv_bn_relu(channels: int = 8, size: int = 16) -> onnx.ModelProto:
    """Conv -> BatchNormalization -> Relu -> GlobalAveragePool: one fused layer on both runtimes."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array((rng.standard_normal((channels, 3, 3, 3)) * 0.3).astype(np.float32), "w"),
             numpy_helper.from_array(rng.uniform(0.5, 1.5, channels).astype(np.float32), "scale"),
             numpy_helper.from_array((rng.standard_normal(channels) * 0.1).astype(np.float32), "bias"),
             numpy_helper.from_array((rng.standard_normal(channels) * 0.1).astype(np.float32), "mean"),
             numpy_helper.from_array(rng.uniform(0.5, 1.5, channels).astype(np.float32), "var")]
    nodes = [helper.make_node("Conv", ["input", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c", "scale", "bias", "mean", "var"], ["b"], name="bn"),
             helper.make_node("Relu", ["b"], ["r"], name="relu"),
             helper.make_node("GlobalAveragePool", ["r"], ["out"], name="pool")]
    return _model(nodes, [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 3, size, size])],
                  [helper.make_tensor_value_info("out", TensorProto.FLOAT, [1, channels, 1, 1])], inits)


def unfusable_qdq_conv(channels: int = 8, size: int = 16) -> tuple[onnx.ModelProto, onnx.ModelProto]:
    """(float reference, QDQ candidate): input -> Q -> DQ and int8 weights -> DQ feed one Conv whose output is not
    quantized, so ONNX Runtime keeps DequantizeLinear -> Conv in float (no QLinearConv)."""
    rng = np.random.default_rng(1)
    weights = (rng.standard_normal((channels, 3, 3, 3)) * 0.3).astype(np.float32)
    scale = float(np.abs(weights).max() / 127)
    quantized = np.clip(np.round(weights / scale), -127, 127).astype(np.int8)
    inputs = [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 3, size, size])]
    outputs = [helper.make_tensor_value_info("out", TensorProto.FLOAT, [1, channels, size, size])]
    reference = _model([helper.make_node("Conv", ["input", "w"], ["out"], name="conv", pads=[1, 1, 1, 1])],
                       inputs, outputs, [numpy_helper.from_array(quantized.astype(np.float32) * scale, "w")])
    inits = [numpy_helper.from_array(quantized, "w_q"), numpy_helper.from_array(np.float32(scale), "w_scale"),
             numpy_helper.from_array(np.int8(0), "w_zero"), numpy_helper.from_array(np.float32(1 / 255), "x_scale"),
             numpy_helper.from_array(np.uint8(0), "x_zero")]
    nodes = [helper.make_node("QuantizeLinear", ["input", "x_scale", "x_zero"], ["x_q"], name="input_QuantizeLinear"),
             helper.make_node("DequantizeLinear", ["x_q", "x_scale", "x_zero"], ["x_dq"],
                              name="input_DequantizeLinear"),
             helper.make_node("DequantizeLinear", ["w_q", "w_scale", "w_zero"], ["w"], name="w_DequantizeLinear"),
             helper.make_node("Conv", ["x_dq", "w"], ["out"], name="conv", pads=[1, 1, 1, 1])]
    return reference, _model(nodes, inputs, outputs, inits)


def overflow_chain(fp16: bool) -> onnx.ModelProto:
    """input [1, 64] in [0, 1) -> Mul 300 (scale) -> Mul 300 (big: up to 9e4, beyond float16's 65504) -> Mul 1e-4
    (back) -> Relu; the fp16 model computes in float16 between Casts at its input and output."""
    dtype = np.float16 if fp16 else np.float32
    inits = [numpy_helper.from_array(np.array(value, dtype), name)
             for name, value in (("k300", 300.0), ("k1e4", 1e-4))]
    nodes = [helper.make_node("Mul", ["x", "k300"], ["scaled"], name="scale"),
             helper.make_node("Mul", ["scaled", "k300"], ["big"], name="big"),
             helper.make_node("Mul", ["big", "k1e4"], ["back"], name="back"),
             helper.make_node("Relu", ["back"], ["y"], name="relu")]
    if fp16:
        nodes = [helper.make_node("Cast", ["input"], ["x"], name="cast_in", to=TensorProto.FLOAT16), *nodes,
                 helper.make_node("Cast", ["y"], ["out"], name="cast_out", to=TensorProto.FLOAT)]
    else:
        nodes[0].input[0] = "input"
        nodes[-1].output[0] = "out"
    return _model(nodes, [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 64])],
                  [helper.make_tensor_value_info("out", TensorProto.FLOAT, [1, 64])], inits)
