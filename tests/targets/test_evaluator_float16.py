"""reference:cpu's float16 Conv, MatMul and Gemm products in float32 BLAS, rounded once: what onnx's own kernels
compute (numpy's float16 loops also accumulate in float32 and round once), only faster; a bias after the product
rounded again, as there."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from qdeploy.targets.evaluator import FLOAT16_BY_BLAS, build_evaluator, direct_conv, run_evaluator

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
def test_float32_ops_are_onnx_own_or_its_sums_in_another_order(op: str) -> None:
    model, feed = _model(op, TensorProto.FLOAT), _feed(op, TensorProto.FLOAT)

    got = run_evaluator(build_evaluator(model), feed)[0]

    want = ReferenceEvaluator(model).run(None, feed)[0]
    if op == "Conv":  # direct_conv: the same float32 products, summed in another order
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    else:
        np.testing.assert_array_equal(got, want)


CONVS = [  # (input shape, weight shape, attributes)
    ([2, 4, 17], [6, 2, 3], {"group": 2, "strides": [2], "pads": [2, 1], "dilations": [3]}),
    ([1, 3, 9, 11], [4, 3, 3, 2], {"auto_pad": "SAME_UPPER", "strides": [2, 3]}),
    ([1, 3, 9, 11], [4, 3, 3, 2], {"auto_pad": "SAME_LOWER", "strides": [2, 2], "dilations": [2, 1]}),
    ([1, 4, 8, 8], [4, 1, 3, 3], {"auto_pad": "VALID", "group": 4}),
    ([1, 2, 5, 6, 7], [3, 2, 2, 3, 2], {"pads": [1, 0, 1, 0, 2, 1], "strides": [1, 2, 1]}),
    ([1, 2, 10], [2, 2, 1], {}),
]


@pytest.mark.parametrize(("shape", "weight", "attributes"), CONVS)
def test_direct_conv_computes_onnx_conv(shape: list[int], weight: list[int], attributes: dict) -> None:
    """Pads (explicit and auto_pad), strides, dilations, groups, 1-D to 3-D, against onnx's kernel in float64."""
    rng = np.random.default_rng(2)
    x, w = rng.normal(size=shape), rng.normal(size=weight)
    node = helper.make_node("Conv", ["x", "w"], ["y"], **attributes)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.DOUBLE, shape)],
                              [helper.make_tensor_value_info("y", TensorProto.DOUBLE, None)],
                              [numpy_helper.from_array(w, "w")])
    want = ReferenceEvaluator(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])).run(
        None, {"x": x})[0]

    got = direct_conv(x, w, **attributes)

    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-10)


def test_a_widely_dilated_float16_conv_runs_without_widening_its_kernel() -> None:
    """brainmaze's spindle detector: 128 channels, kernel 3 at dilation 2048 over 7,500 samples; onnx's kernel asked
    for a 29 GiB index array and the fp16 check was reported unavailable."""
    rng = np.random.default_rng(3)
    weights = [numpy_helper.from_array(rng.normal(0, 0.1, (128, 128, 3)).astype(np.float16), "w")]
    node = helper.make_node("Conv", ["x", "w"], ["y"], dilations=[2048], kernel_shape=[3])
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT16, [1, 128, 7500])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT16, None)], weights)
    x = rng.normal(size=(1, 128, 7500)).astype(np.float16)

    got = run_evaluator(build_evaluator(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])),
                        {"x": x})[0]

    assert got.shape == (1, 128, 7500 - 2 * 2048) and got.dtype == np.float16
    w = onnx.numpy_helper.to_array(weights[0]).astype(np.float32)
    column = 100  # one output sample, summed by hand: taps at t, t + 2048, t + 4096
    by_hand = sum(w[:, :, k] @ x[0, :, column + 2048 * k].astype(np.float32) for k in range(3))
    np.testing.assert_allclose(got[0, :, column].astype(np.float32), by_hand, rtol=2e-3, atol=2e-3)
