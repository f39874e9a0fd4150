"""ONNX Runtime's quantizer names what it adds after the tensor it comes from and never checks the name is free:
a bias two Convs share is copied as ``bias`` + the next number, a weight's scale is ``weight_scale``.  basic-pitch's
tf2onnx graph (Conv outputs named after their shared bias followed by a digit) failed every int8 build with
"Duplicate definition of name".  Preparing renames the model's own tensors that hold such names
(``qdeploy.graph.names.rename_quantizer_derived``)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from qdeploy.graph.names import QUANTIZER_SUFFIX, rename_quantizer_derived
from qdeploy.stages import quantize
from qdeploy.stages.quantize import QuantizeConfig
from tests.helpers.quantize import cosine, init, run_ort, save_artifact, stage_context


def shared_bias_model() -> onnx.ModelProto:
    """Two Convs read the bias ``conv_25``; the first writes ``conv_252`` (the copy's name: ``conv_25`` + 2), the
    second ``w_scale`` (the name of the scale of its weight ``w``); both reach the output through an Add."""
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("Conv", ["x", "w", "conv_25"], ["conv_252"], pads=[1, 1, 1, 1], name="first"),
             helper.make_node("Conv", ["x", "v", "conv_25"], ["w_scale"], pads=[1, 1, 1, 1], name="second"),
             helper.make_node("Add", ["conv_252", "w_scale"], ["y"], name="add")]
    weights = [init("w", rng.standard_normal((8, 3, 3, 3)) / 3), init("v", rng.standard_normal((8, 3, 3, 3)) / 3),
               init("conv_25", rng.standard_normal(8) / 10)]
    graph = helper.make_graph(nodes, "shared_bias", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                                   [1, 3, 16, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 16, 16])], weights)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_names_the_quantizer_derives_are_freed_and_the_interface_kept() -> None:
    model = shared_bias_model()
    model.graph.node[2].output[0] = "conv_252_quantized"  # the output: derived too, but the model's own name
    model.graph.output[0].name = "conv_252_quantized"
    assert rename_quantizer_derived(model.graph) == 2
    nodes = model.graph.node
    assert [list(node.output) for node in nodes] == [[f"conv_252{QUANTIZER_SUFFIX}"], [f"w_scale{QUANTIZER_SUFFIX}"],
                                                      ["conv_252_quantized"]]
    assert list(nodes[2].input) == [f"conv_252{QUANTIZER_SUFFIX}", f"w_scale{QUANTIZER_SUFFIX}"]
    assert rename_quantizer_derived(model.graph) == 0


def test_a_number_counts_only_after_a_float_initializer() -> None:
    """``relu1`` after the activation ``relu`` is no copy the quantizer makes: left alone."""
    nodes = [helper.make_node("Relu", ["x"], ["relu"]), helper.make_node("Relu", ["relu"], ["relu1"]),
             helper.make_node("Relu", ["relu1"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    assert rename_quantizer_derived(graph) == 0


@pytest.mark.parametrize("runtime", ["ort", "openvino"])
def test_a_model_holding_derived_names_quantizes_and_loads(tmp_path: Path, runtime: str) -> None:
    context = dataclasses.replace(stage_context(tmp_path, ranges={"x": (-1.0, 1.0)}), variant=f"int8@{runtime}",
                                  targets=("ort:cpu",) if runtime == "ort" else ("openvino:cpu",))
    model = quantize.run(save_artifact(tmp_path, shared_bias_model()), QuantizeConfig(mode="ptq"), context).model
    assert sum(node.op_type == "Conv" for node in model.graph.node) == 2
    assert any(node.op_type == "DequantizeLinear" for node in model.graph.node)
    feed = {"x": np.random.default_rng(1).uniform(-1, 1, (1, 3, 16, 16)).astype(np.float32)}
    assert cosine(run_ort(model, feed)[0], run_ort(shared_bias_model(), feed)[0]) > 0.99
