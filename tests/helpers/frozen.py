"""A model OpenVINO cannot read as exported, shaped like silero-vad's: an int64 scalar input ``sr`` decides an If
whose branches give the Conv after it inputs of different ranks, so the Conv's input rank is unknown when OpenVINO
converts it ("The input data tensor's rank has to be known")."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

__all__ = ["RATE", "SAMPLES", "rate_if_model", "write_rate_if_model"]

RATE = 16000
SAMPLES = 16


def rate_if_model() -> onnx.ModelProto:
    """``audio [batch, 1, 16]`` and ``sr`` (int64 scalar): at 16 kHz the audio goes to the Conv as it is, at any
    other rate it is first scaled and unsqueezed (rank 4, which the Conv would refuse at run time)."""
    rng = np.random.default_rng(0)
    weight = numpy_helper.from_array(rng.standard_normal((4, 1, 3)).astype(np.float32), "weight")
    rate = numpy_helper.from_array(np.array(RATE, np.int64), "rate")
    half = numpy_helper.from_array(np.array(0.5, np.float32), "half")
    zero = numpy_helper.from_array(np.array(0.0, np.float32), "zero")
    axes = numpy_helper.from_array(np.array([0], np.int64), "axes")
    then_branch = helper.make_graph([helper.make_node("Identity", ["audio"], ["taken"])], "at_rate", [],
                                    [helper.make_tensor_value_info("taken", TensorProto.FLOAT, None)])
    else_branch = helper.make_graph(
        [helper.make_node("Mul", ["audio", "half"], ["scaled"]),
         helper.make_node("Unsqueeze", ["scaled", "axes"], ["lifted"])], "other_rate", [],
        [helper.make_tensor_value_info("lifted", TensorProto.FLOAT, None)])
    nodes = [
        helper.make_node("Equal", ["sr", "rate"], ["is_rate"], name="is_rate"),
        helper.make_node("If", ["is_rate"], ["chosen"], name="by_rate", then_branch=then_branch,
                         else_branch=else_branch),
        helper.make_node("Conv", ["chosen", "weight"], ["features"], name="conv", pads=[1, 1]),
        # silero-vad keeps sr in its interface the same way: state + float(sr) * 0
        helper.make_node("Cast", ["sr"], ["sr_float"], name="sr_float", to=TensorProto.FLOAT),
        helper.make_node("Mul", ["sr_float", "zero"], ["sr_zero"], name="sr_zero"),
        helper.make_node("Add", ["features", "sr_zero"], ["shifted"], name="shift"),
        helper.make_node("Relu", ["shifted"], ["scores"], name="relu"),
    ]
    graph = helper.make_graph(
        nodes, "rate_if",
        [helper.make_tensor_value_info("audio", TensorProto.FLOAT, ["batch", 1, SAMPLES]),
         helper.make_tensor_value_info("sr", TensorProto.INT64, [])],
        [helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["batch", 4, SAMPLES])],
        [weight, rate, half, zero, axes])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.checker.check_model(model)
    return model


def write_rate_if_model(folder: Path) -> Path:
    path = folder / "rate_if.onnx"
    onnx.save(rate_if_model(), path)
    return path
