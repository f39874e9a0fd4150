"""Float models widened (``qdeploy.graph.widen``): the arbiter's float64 copy; half-precision models made float32
inside for quantizing, and their weights narrowed back."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from qdeploy.graph.widen import half_to_float32, holds_half, narrow_weights, to_float64


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


def _half_model(half: int) -> onnx.ModelProto:
    """A float16 (or bfloat16) model: a half input read by an If branch, a half weight, a half Constant, a Cast
    to half from an integer, ConstantOfShape's half value, a half output and the input also passed straight
    out."""
    numpy_half = helper.tensor_dtype_to_np_dtype(half)
    branch = helper.make_graph([helper.make_node("Mul", ["x", "inner"], ["branch_out"])], "then", [],
                               [helper.make_tensor_value_info("branch_out", half, [1, 3])],
                               [numpy_helper.from_array(np.full((1, 3), 0.5).astype(numpy_half), "inner")])
    other = helper.make_graph([helper.make_node("Neg", ["x"], ["other_out"])], "else", [],
                              [helper.make_tensor_value_info("other_out", half, [1, 3])])
    nodes = [helper.make_node("Constant", [], ["third"], value=numpy_helper.from_array(
                 np.array([0.25, 0.5, 1.0]).astype(numpy_half))),
             helper.make_node("Cast", ["count"], ["count_half"], to=half),
             helper.make_node("ConstantOfShape", ["shape"], ["ones"], value=numpy_helper.from_array(
                 np.array([0.75]).astype(numpy_half))),
             helper.make_node("If", ["flag"], ["gated"], then_branch=branch, else_branch=other),
             helper.make_node("Mul", ["gated", "weight"], ["a"]), helper.make_node("Add", ["a", "third"], ["b"]),
             helper.make_node("Mul", ["b", "count_half"], ["c"]), helper.make_node("Add", ["c", "ones"], ["y"])]
    inits = [numpy_helper.from_array(np.array([3], np.int64), "count"),
             numpy_helper.from_array(np.array([1, 3], np.int64), "shape"),
             numpy_helper.from_array(np.array(True), "flag"),
             numpy_helper.from_array(np.full((1, 3), 2.0).astype(numpy_half), "weight")]
    graph = helper.make_graph(nodes, "half", [helper.make_tensor_value_info("x", half, [1, 3])],
                              [helper.make_tensor_value_info("y", half, [1, 3]),
                               helper.make_tensor_value_info("x", half, [1, 3])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


@pytest.mark.parametrize("half", [TensorProto.FLOAT16, TensorProto.BFLOAT16])
def test_a_half_model_becomes_float32_inside_and_keeps_its_interface(half: int) -> None:
    model = _half_model(half)
    assert holds_half(model)
    assert half_to_float32(model) == 2  # the input x and the output y: the passed-through x is the input
    onnx.checker.check_model(model, full_check=True)
    assert [value.type.tensor_type.elem_type for value in (*model.graph.input, *model.graph.output)] == [half] * 3
    inner = onnx.ModelProto()
    inner.CopyFrom(model)
    del inner.graph.input[:], inner.graph.output[:]
    casts_back = [node for node in inner.graph.node if node.name.endswith("_cast_back")]
    assert [node.output[0] for node in casts_back] == ["y"]
    for node in casts_back:
        inner.graph.node.remove(node)
    assert not holds_half(inner)  # nothing half inside: weights, constants, casts, branches
    x = np.array([[1.5, -2.0, 7.25]], np.float32)
    numpy_half = helper.tensor_dtype_to_np_dtype(half)
    y, passed = ReferenceEvaluator(model).run(None, {"x": x.astype(numpy_half)})
    exact = ((x.astype(np.float32) * 0.5 * 2.0 + np.array([0.25, 0.5, 1.0])) * 3 + 0.75)
    assert y.dtype == numpy_half and passed.dtype == numpy_half
    np.testing.assert_allclose(y.astype(np.float32), exact.astype(numpy_half).astype(np.float32), rtol=0)


def test_narrowed_weights_take_their_half_type_again_behind_a_cast() -> None:
    rng = np.random.default_rng(0)
    weight = rng.standard_normal((64, 32)).astype(np.float16)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["y"]), helper.make_node("Add", ["y", "b"], ["z"])]
    graph = helper.make_graph(nodes, "narrow", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 64])],
                              [helper.make_tensor_value_info("z", TensorProto.FLOAT, [2, 32])],
                              [numpy_helper.from_array(weight.astype(np.float32), "w"),
                               numpy_helper.from_array(np.ones(32, np.float32), "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    x = rng.standard_normal((2, 64)).astype(np.float32)
    before = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    assert narrow_weights(model, {"w": TensorProto.FLOAT16, "b": TensorProto.FLOAT16}) == 1  # the bias is small
    onnx.checker.check_model(model, full_check=True)
    stored = {tensor.name: tensor.data_type for tensor in model.graph.initializer}
    assert stored == {"w": TensorProto.FLOAT16, "b": TensorProto.FLOAT}
    after = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    np.testing.assert_array_equal(after[0], before[0])  # the weight's values were float16's: exact
