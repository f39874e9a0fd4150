"""A Concat input of length 0 (PyTorch's empty ``ConstantOfShape`` in brainmaze's spindle detector) is dropped
before quantizing, also for a model quantized without simplify: ONNX Runtime's quantizer made it an empty int8
constant that OpenVINO reads as a scalar, and the int8 model did not load there."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import onnx
from onnx import helper

from qdeploy.stages import quantize
from qdeploy.stages.quantize import QuantizeConfig
from tests.helpers.quantize import (
    cosine,
    init,
    make_model,
    openvino_agrees_with_ort,
    run_ort,
    save_artifact,
    stage_context,
)


def _with_empty_input() -> onnx.ModelProto:
    """x [1, 4, 16] -> Conv -> Relu -> Concat([relu, an empty [1, 8, 0] constant], axis 2)."""
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1], name="conv"),
             helper.make_node("Relu", ["c"], ["r"], name="relu"),
             helper.make_node("Concat", ["r", "empty"], ["y"], axis=2, name="cat")]
    weights = [init("w", rng.normal(0, 0.3, (8, 4, 3))), init("empty", np.zeros((1, 8, 0)))]
    return make_model(nodes, weights, {"x": [1, 4, 16]}, {"y": [1, 8, 16]})


def test_an_unsimplified_model_with_an_empty_concat_input_quantizes_into_a_graph_openvino_reads(
        tmp_path: Path) -> None:
    context = dataclasses.replace(stage_context(tmp_path), variant="int8@ort", targets=("ort:cpu", "openvino:cpu"))
    result = quantize.run(save_artifact(tmp_path, _with_empty_input()), quantize_config(), context)
    feed = {"x": np.random.default_rng(1).normal(size=(1, 4, 16)).astype(np.float32)}
    assert openvino_agrees_with_ort(result.model, feed) > 0.999
    assert cosine(run_ort(result.model, feed)[0], run_ort(_with_empty_input(), feed)[0]) > 0.99
    assert result.report()["empty_concat_inputs_dropped"] == 1
    assert "Concat" not in {node.op_type for node in result.model.graph.node}
    assert all(0 not in init.dims for init in result.model.graph.initializer)


def quantize_config() -> QuantizeConfig:
    return QuantizeConfig(mode="ptq", runtime="ort", calibration={"samples": 4})
