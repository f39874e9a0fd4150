"""ONNX Runtime's quantizer sorts a graph by its nodes' own inputs and misses what a subgraph reads from outside:
a Loop whose inputs are all constants went first, before the producer of the tensor its body gathers from.
OpenVINO could not read mk8dx's Keras BiLSTM that way ("ReverseV2:0 node not found in graph cache"); the stage's
output is in scope order."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from qdeploy.graph.order import scope_problems
from qdeploy.stages import quantize
from qdeploy.stages.quantize import CalibrationRef, QuantizeConfig
from tests.helpers.quantize import npy_folder, save_artifact, stage_context


def _loop_reading_outer_tensor() -> onnx.ModelProto:
    """x @ W -> Relu -> r; a Loop (constant inputs only) sums r's rows, read from its body; then @ W again."""
    weights = numpy_helper.from_array(np.random.default_rng(0).normal(size=(8, 8)).astype(np.float32), "W")
    body = helper.make_graph(
        [helper.make_node("Unsqueeze", ["i", "axes"], ["i1"]), helper.make_node("Gather", ["r", "i1"], ["row"]),
         helper.make_node("Squeeze", ["row", "axes"], ["row1"]), helper.make_node("Add", ["acc_in", "row1"], ["acc"]),
         helper.make_node("Identity", ["cond_in"], ["cond_out"])], "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("acc_in", TensorProto.FLOAT, [1, 8])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("acc", TensorProto.FLOAT, [1, 8])],
        [numpy_helper.from_array(np.array([0], np.int64), "axes")])
    nodes = [helper.make_node("MatMul", ["x", "W"], ["y"]), helper.make_node("Relu", ["y"], ["r"]),
             helper.make_node("Loop", ["trips", "go", "zeros"], ["total"], body=body),
             helper.make_node("MatMul", ["total", "W"], ["out"])]
    inits = [weights, numpy_helper.from_array(np.array(4, np.int64), "trips"),
             numpy_helper.from_array(np.array(True), "go"),
             numpy_helper.from_array(np.zeros((1, 8), np.float32), "zeros")]
    graph = helper.make_graph(nodes, "loop", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 1, 8])],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, [1, 8])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_the_quantized_model_reads_no_tensor_before_its_producer(tmp_path: Path) -> None:
    calib = npy_folder(tmp_path, (4, 1, 8), 8)
    config = QuantizeConfig(calibration=CalibrationRef(data="calib"))

    result = quantize.run(save_artifact(tmp_path, _loop_reading_outer_tensor()), config,
                          stage_context(tmp_path, {"calib": calib}))

    assert result.findings.quantized_nodes.get("MatMul") == 2
    assert scope_problems(result.model.graph) == []  # as saved for the int8 kernel count and the runtimes
