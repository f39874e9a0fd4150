"""reference:cpu's float16 Conv, MatMul and Gemm products in float32 BLAS, rounded once: what onnx's own kernels
compute (numpy's float16 loops also accumulate in float32 and round once), only faster; a bias after the product
rounded again, as there."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from qdeploy.targets.evaluator import FLOAT16_BY_BLAS, build_evaluator, run_evaluator

CASES = {  # op: (node attributes, input shapes, weight shapes)
    "Conv": ({"group": 2, "strides": [2, 2], "pads": [1, 0, 1, 2], "dilations": [1, 2]},
             [1, 4, 9, 11], [[6, 2, 3, 3], [6]]),
    "MatMul": ({}, [2, 5, 24], [[24, 7]]),
    "Gemm": ({"transB": 1, "alpha": 0.5, "beta": 2.0}, [5, 24], [[7, 24], [7]]),
}


def _model(op: str, element: int) -> onnx.ModelProto:
    """The op with float16-representable weights, stored as ``element``."""
    attributes, shape, weight_shapes = CASES[op]
    rng = np.random.default_rng(0)
    dtype = helper.tensor_dtype_to_np_dtype(element)
    weights = [numpy_helper.from_array(rng.normal(0, 0.5, size).astype(np.float16).astype(dtype), f"w{index}")
               for index, size in enumerate(weight_shapes)]
    node = helper.make_node(op, ["x", *(weight.name for weight in weights)], ["y"], name=op.lower(), **attributes)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", element, shape)],
                              [helper.make_tensor_value_info("y", element, None)], weights)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _feed(op: str, element: int) -> dict[str, np.ndarray]:
    dtype = helper.tensor_dtype_to_np_dtype(element)
    return {"x": np.random.default_rng(1).normal(0, 2, CASES[op][1]).astype(np.float16).astype(dtype)}


@pytest.mark.parametrize("op", sorted(FLOAT16_BY_BLAS))
def test_float16_ops_compute_what_onnx_computes(op: str) -> None:
    model, feed = _model(op, TensorProto.FLOAT16), _feed(op, TensorProto.FLOAT16)
    evaluator = build_evaluator(model)

    got = run_evaluator(evaluator, feed)[0]
    want = ReferenceEvaluator(model).run(None, feed)[0]

    exact = ReferenceEvaluator(_model(op, TensorProto.DOUBLE)).run(None, _feed(op, TensorProto.DOUBLE))[0]

    assert type(evaluator.rt_nodes_[0]).__module__ == "qdeploy.targets.evaluator"  # qdeploy's kernel ran
    assert got.dtype == np.float16 and got.shape == want.shape
    # the same float32 sums in another order, rounded at the same steps: nearly all equal, the rest a step apart
    assert np.mean(got == want) > 0.97
    assert np.abs(got.astype(np.float64) - want).max() <= float(np.abs(exact).max()) * 2**-10
    assert np.abs(got - exact).max() <= np.abs(want - exact).max() * 1.5  # no less exact than onnx's kernel


@pytest.mark.parametrize("op", sorted(FLOAT16_BY_BLAS))
def test_float32_ops_are_onnx_own(op: str) -> None:
    model, feed = _model(op, TensorProto.FLOAT), _feed(op, TensorProto.FLOAT)

    got = run_evaluator(build_evaluator(model), feed)[0]

    np.testing.assert_array_equal(got, ReferenceEvaluator(model).run(None, feed)[0])
