"""reference:cpu's Softmax, LogSoftmax and Hardmax: opset 11's flatten-to-2-D semantics, and a float16 LogSoftmax
that stays finite where a deployed float16 kernel does (onnx's own takes the log of an underflowed probability)."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

from qdeploy.targets.evaluator import NORMALIZERS, build_evaluator, run_evaluator


def _model(op: str, opset: int, element: int, shape: list[int], **attributes: int) -> onnx.ModelProto:
    node = helper.make_node(op, ["x"], ["y"], name=op.lower(), **attributes)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", element, shape)],
                              [helper.make_tensor_value_info("y", element, shape)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 7
    return model


@pytest.mark.parametrize("op", sorted(NORMALIZERS))
@pytest.mark.parametrize("axis", [None, 0, 1, -2])
def test_opset_11_normalizes_over_the_trailing_axes_as_onnxruntime_does(op: str, axis: int | None) -> None:
    model = _model(op, 11, TensorProto.FLOAT, [2, 3, 4], **({} if axis is None else {"axis": axis}))
    feed = {"x": np.random.default_rng(0).normal(0, 2, (2, 3, 4)).astype(np.float32)}

    got = run_evaluator(build_evaluator(model), feed)[0]

    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feed)[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_the_opset_11_case_is_one_onnx_own_kernel_gets_wrong() -> None:
    """What the corrected kernel is for: onnx's normalises over axis 1 alone."""
    model = _model("Softmax", 11, TensorProto.FLOAT, [2, 3, 4], axis=1)
    feed = {"x": np.random.default_rng(0).normal(0, 2, (2, 3, 4)).astype(np.float32)}
    plain = ReferenceEvaluator(model).run(None, feed)[0]
    assert abs(plain.sum(axis=(1, 2)) - 1).max() > 0.5  # each 3-vector sums to 1, not each 3x4 block
    assert abs(run_evaluator(build_evaluator(model), feed)[0].sum(axis=(1, 2)) - 1).max() < 1e-3


def test_float16_log_softmax_stays_finite_where_a_probability_underflows() -> None:
    """A spread of 40 between logits: exp(-40) is below float16's smallest subnormal, its log still -40."""
    model = _model("LogSoftmax", 17, TensorProto.FLOAT16, [3, 7])
    logits = np.random.default_rng(1).normal(0, 1, (3, 7))
    logits[:, 2] -= 40.0
    feed = {"x": logits.astype(np.float16)}

    evaluator = build_evaluator(model)
    got = run_evaluator(evaluator, feed)[0]

    assert type(evaluator.rt_nodes_[0]).__module__ == "qdeploy.targets.evaluator"
    with np.errstate(divide="ignore"):
        assert np.isinf(ReferenceEvaluator(model).run(None, feed)[0]).any()  # onnx's log of a rounded-off 0
    exact = feed["x"].astype(np.float64)
    exact = exact - exact.max(axis=-1, keepdims=True)
    exact -= np.log(np.exp(exact).sum(axis=-1, keepdims=True))
    assert got.dtype == np.float16 and np.isfinite(got).all()
    np.testing.assert_allclose(got.astype(np.float64), exact, rtol=2**-10, atol=2**-10)


@pytest.mark.parametrize("op", ["LayerNormalization", "RMSNormalization"])
def test_float16_normalizations_keep_their_statistics_in_float32_as_the_schema_says(op: str) -> None:
    """Values of about 600: squared in float16 they are Inf, and onnx's kernels normalise to 0 (minimol's fp16)."""
    scale, bias = (onnx.numpy_helper.from_array(np.full(16, value, np.float16), name)
                   for value, name in ((1.5, "scale"), (0.25, "bias")))
    inputs = ["x", "scale", "bias"] if op == "LayerNormalization" else ["x", "scale"]
    graph = helper.make_graph([helper.make_node(op, inputs, ["y"], name="norm", axis=-1)], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT16, [2, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT16, [2, 16])],
                              [scale, bias][:len(inputs) - 1])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17 if op == "LayerNormalization"
                                                                        else 23)])
    model.ir_version = 8
    feed = {"x": (np.random.default_rng(0).normal(0, 1, (2, 16)) * 600).astype(np.float16)}

    got = run_evaluator(build_evaluator(model), feed)[0]

    x = feed["x"].astype(np.float64)
    if op == "LayerNormalization":
        exact = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-5) * 1.5 + 0.25
    else:
        exact = x / np.sqrt((x**2).mean(-1, keepdims=True) + 1e-5) * 1.5
    with np.errstate(all="ignore"):
        assert np.abs(ReferenceEvaluator(model).run(None, feed)[0] - exact).max() > 1  # onnx's: overflowed
    assert got.dtype == np.float16
    np.testing.assert_allclose(got.astype(np.float64), exact, atol=4e-3)
