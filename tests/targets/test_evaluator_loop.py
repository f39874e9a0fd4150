"""reference:cpu's Loop stacks its scan outputs on a new first axis, as the schema and ONNX Runtime do; onnx's
kernel ``np.vstack``s them, which turns an iteration's ``[1, 4]`` into rows of ``[N, 4]`` and a scalar into
``[N, 1]`` (chars2vec's Keras LSTM written as a Loop: its fp16 check was unavailable)."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from qdeploy.targets.evaluator import build_evaluator, run_evaluator


def _loop(step_shape: list[int]) -> onnx.ModelProto:
    """A Loop of 3 iterations whose body emits ``x * i`` (reshaped to ``step_shape``) as a scan output."""
    body = helper.make_graph(
        [helper.make_node("Cast", ["i"], ["i_float"], to=TensorProto.FLOAT),
         helper.make_node("Mul", ["x", "i_float"], ["scaled"]),
         helper.make_node("Reshape", ["scaled", "shape"], ["step"]),
         helper.make_node("Identity", ["cond_in"], ["cond_out"])], "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("step", TensorProto.FLOAT, step_shape)],
        [numpy_helper.from_array(np.array(step_shape, np.int64), "shape")])
    graph = helper.make_graph(
        [helper.make_node("Loop", ["trips", "go"], ["steps"], body=body)], "loop",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [int(np.prod(step_shape))])],
        [helper.make_tensor_value_info("steps", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(np.array(3, np.int64), "trips"), numpy_helper.from_array(np.array(True), "go")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("step_shape", [[1, 4], [], [2, 2]])
def test_loop_scan_outputs_are_stacked_as_onnxruntime_stacks_them(step_shape: list[int]) -> None:
    model = _loop(step_shape)
    x = np.arange(1, int(np.prod(step_shape)) + 1, dtype=np.float32)

    expected = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    got = run_evaluator(build_evaluator(model), {"x": x})

    assert got[0].shape == expected[0].shape == (3, *step_shape)
    np.testing.assert_array_equal(got[0], expected[0])
