"""The float64 copy of a float32 model (``qdeploy.graph.float64``), the arbiter's arithmetic."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from qdeploy.graph.float64 import to_float64


def _model() -> onnx.ModelProto:
    """Every place a float32 value can sit: an input, an initializer, a Constant's value_float and tensor, a Cast
    to float from int, ConstantOfShape's value, and an If branch with an initializer of its own."""
    branch = helper.make_graph([helper.make_node("Mul", ["mixed", "inner"], ["branch_out"])], "then", [],
                               [helper.make_tensor_value_info("branch_out", TensorProto.FLOAT, [1, 3])],
                               [numpy_helper.from_array(np.full((1, 3), 1.0 / 3.0, np.float32), "inner")])
    other = helper.make_graph([helper.make_node("Neg", ["mixed"], ["other_out"])], "else", [],
                              [helper.make_tensor_value_info("other_out", TensorProto.FLOAT, [1, 3])])
    nodes = [helper.make_node("Constant", [], ["tenth"], value_float=0.1),
             helper.make_node("Constant", [], ["thirds"], value=numpy_helper.from_array(
                 np.array([1 / 3, 2 / 3, 1.0], np.float32))),
             helper.make_node("Cast", ["count"], ["count_float"], to=TensorProto.FLOAT),
             helper.make_node("ConstantOfShape", ["shape"], ["ones"], value=numpy_helper.from_array(
                 np.array([0.7], np.float32))),
             helper.make_node("Mul", ["x", "tenth"], ["a"]), helper.make_node("Add", ["a", "thirds"], ["b"]),
             helper.make_node("Mul", ["b", "count_float"], ["c"]), helper.make_node("Add", ["c", "ones"], ["mixed"]),
             helper.make_node("If", ["flag"], ["y"], then_branch=branch, else_branch=other)]
    inits = [numpy_helper.from_array(np.array([3], np.int64), "count"),
             numpy_helper.from_array(np.array([1, 3], np.int64), "shape"),
             numpy_helper.from_array(np.array(True), "flag")]
    graph = helper.make_graph(nodes, "widen", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return model


def test_every_float32_value_is_widened_and_the_function_is_the_same() -> None:
    model = _model()
    wide = to_float64(model)
    onnx.checker.check_model(wide, full_check=True)
    x = np.array([[1.5, -2.0, 7.25]], np.float32)
    narrow = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    (exact,) = ReferenceEvaluator(wide).run(None, {"x": x.astype(np.float64)})
    assert exact.dtype == np.float64
    expected = ((x.astype(np.float64) * 0.1 + np.array([1 / 3, 2 / 3, 1.0])) * 3 + 0.7) / 3
    np.testing.assert_allclose(exact, expected, rtol=1e-7)  # float64 arithmetic on float32's constants
    np.testing.assert_allclose(narrow, exact, rtol=1e-6)
    assert model.graph.input[0].type.tensor_type.elem_type == TensorProto.FLOAT  # the original is left alone
