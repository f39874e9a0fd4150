"""The rewrite registry: each rewrite on a tiny model, checked against ONNX Runtime running the original op."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from pydantic import ValidationError

from qdeploy.graph.rewrites import RewriteReport, apply_rewrites, available, default_names
from qdeploy.stages.simplify import SimplifyConfig

RNG = np.random.default_rng(3)


def _model(nodes: list[onnx.NodeProto], x_shape: list[int], y_shape: list[int] | None, inits: list = (),
           opset: int = 17) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, y_shape)], list(inits))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


def _run(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0]


def _rewritten(model: onnx.ModelProto, names: list[str], *, check: bool = True) -> tuple[onnx.ModelProto,
                                                                                        RewriteReport]:
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    report = RewriteReport()
    apply_rewrites(copy, names, report)
    if check:
        onnx.checker.check_model(copy)
    return copy, report


def _ops(model: onnx.ModelProto) -> list[str]:
    return [node.op_type for node in model.graph.node]


def test_registry_lists_the_rewrites_with_their_defaults() -> None:
    rules = available()
    assert {"prelu_to_relu", "hardswish_to_hardsigmoid", "gelu_to_erf", "layernorm_to_primitives",
            "fuse_conv_scale_bias", "fuse_conv_batchnorm"} <= set(rules)
    assert "prelu_to_relu" not in default_names() and "fuse_conv_scale_bias" in default_names()
    assert all(rule.description for rule in rules.values())
    assert SimplifyConfig().rewrites == default_names()


def test_unknown_or_repeated_rewrite_fails_validation() -> None:
    with pytest.raises(ValidationError, match="prelu_to_relu"):  # the known names are listed
        SimplifyConfig(rewrites=["prelu_to_nothing"])
    with pytest.raises(ValidationError, match="repeat"):
        SimplifyConfig(rewrites=["prelu_to_relu", "prelu_to_relu"])


def test_prelu_to_relu_is_exact_with_a_per_channel_slope() -> None:
    slope = numpy_helper.from_array(RNG.uniform(0.05, 0.5, (3, 1, 1)).astype(np.float32), "slope")
    model = _model([helper.make_node("PRelu", ["x", "slope"], ["y"], name="prelu")], [1, 3, 4, 4], [1, 3, 4, 4],
                   [slope])
    rewritten, report = _rewritten(model, ["prelu_to_relu"])
    assert "PRelu" not in _ops(rewritten) and "Relu" in _ops(rewritten)
    assert report.applied["prelu_to_relu"] == 1
    x = RNG.standard_normal((1, 3, 4, 4)).astype(np.float32)
    np.testing.assert_array_equal(_run(rewritten, x), _run(model, x))


def test_hardswish_decomposes_for_runtimes_before_opset_14() -> None:
    model = _model([helper.make_node("HardSwish", ["x"], ["y"])], [2, 64], [2, 64], opset=14)
    rewritten, _ = _rewritten(model, ["hardswish_to_hardsigmoid"])
    assert _ops(rewritten) == ["HardSigmoid", "Mul"]
    x = (RNG.standard_normal((2, 64)) * 4).astype(np.float32)
    np.testing.assert_allclose(_run(rewritten, x), _run(model, x), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_decomposes_into_primitive_ops(approximate: str) -> None:
    model = _model([helper.make_node("Gelu", ["x"], ["y"], approximate=approximate)], [4, 32], [4, 32], opset=20)
    rewritten, _ = _rewritten(model, ["gelu_to_erf"])
    assert "Gelu" not in _ops(rewritten)
    assert ("Erf" in _ops(rewritten)) == (approximate == "none")
    x = (RNG.standard_normal((4, 32)) * 3).astype(np.float32)
    np.testing.assert_allclose(_run(rewritten, x), _run(model, x), rtol=1e-5, atol=2e-6)


@pytest.mark.parametrize("opset", [17, 18])  # ReduceMean takes axes as an attribute, then as an input
def test_layernorm_decomposes_for_older_runtimes(opset: int) -> None:
    inits = [numpy_helper.from_array(RNG.uniform(0.5, 1.5, 16).astype(np.float32), "gamma"),
             numpy_helper.from_array(RNG.standard_normal(16).astype(np.float32), "beta")]
    node = helper.make_node("LayerNormalization", ["x", "gamma", "beta"], ["y"], axis=-1, epsilon=1e-5)
    model = _model([node], [2, 5, 16], [2, 5, 16], inits, opset=opset)
    rewritten, _ = _rewritten(model, ["layernorm_to_primitives"])
    assert "LayerNormalization" not in _ops(rewritten) and _ops(rewritten).count("ReduceMean") == 2
    x = (RNG.standard_normal((2, 5, 16)) * 2 + 1).astype(np.float32)
    np.testing.assert_allclose(_run(rewritten, x), _run(model, x), rtol=1e-5, atol=1e-5)


def test_layernorm_with_unknown_rank_and_negative_axis_is_refused_with_a_reason() -> None:
    inits = [numpy_helper.from_array(np.ones(4, np.float32), "gamma")]
    node = helper.make_node("LayerNormalization", ["x", "gamma"], ["y"], axis=-1, name="ln")
    model = _model([node], None, None, inits)
    rewritten, report = _rewritten(model, ["layernorm_to_primitives"], check=False)
    assert _ops(rewritten) == ["LayerNormalization"]
    assert "rank" in report.refused["layernorm_to_primitives"]["ln"]


def _conv_model(after: list[onnx.NodeProto], inits: list[onnx.TensorProto], op: str = "Conv") -> onnx.ModelProto:
    weight = RNG.standard_normal((4, 3, 3, 3) if op == "Conv" else (3, 4, 3, 3)).astype(np.float32)
    conv = helper.make_node(op, ["x", "w", "b"], ["c"], name="conv", pads=[1, 1, 1, 1])
    inits = [numpy_helper.from_array(weight, "w"), numpy_helper.from_array(RNG.standard_normal(4).astype(np.float32),
                                                                            "b"), *inits]
    return _model([conv, *after], [1, 3, 6, 6], [1, 4, 6, 6], inits)


def test_conv_followed_by_per_channel_mul_and_scalar_add_becomes_one_conv() -> None:
    after = [helper.make_node("Mul", ["c", "s"], ["m"]), helper.make_node("Add", ["k", "m"], ["y"])]
    model = _conv_model(after, [numpy_helper.from_array(RNG.uniform(0.5, 2, (1, 4, 1, 1)).astype(np.float32), "s"),
                                numpy_helper.from_array(np.array(0.25, np.float32), "k")])
    rewritten, report = _rewritten(model, default_names())
    assert _ops(rewritten) == ["Conv"] and report.applied["fuse_conv_scale_bias"] == 2
    assert {"w", "s", "k"}.isdisjoint(init.name for init in rewritten.graph.initializer)  # old weights dropped
    x = RNG.standard_normal((1, 3, 6, 6)).astype(np.float32)
    np.testing.assert_allclose(_run(rewritten, x), _run(model, x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("op", ["Conv", "ConvTranspose"])
def test_batchnorm_after_a_conv_or_convtranspose_is_fused(op: str) -> None:
    params = [RNG.uniform(0.5, 1.5, 4), RNG.standard_normal(4), RNG.standard_normal(4), RNG.uniform(0.5, 2, 4)]
    inits = [numpy_helper.from_array(value.astype(np.float32), name)
             for value, name in zip(params, ["g", "bt", "mu", "var"], strict=True)]
    bn = helper.make_node("BatchNormalization", ["c", "g", "bt", "mu", "var"], ["y"], epsilon=1e-3)
    model = _conv_model([bn], inits, op=op)
    rewritten, _ = _rewritten(model, default_names())
    assert _ops(rewritten) == [op]
    x = RNG.standard_normal((1, 3, 6, 6)).astype(np.float32)
    np.testing.assert_allclose(_run(rewritten, x), _run(model, x), rtol=1e-4, atol=1e-5)


def test_affine_ops_that_are_not_per_channel_or_share_the_conv_output_are_left() -> None:
    spatial = numpy_helper.from_array(RNG.standard_normal((1, 1, 6, 6)).astype(np.float32), "s")
    model = _conv_model([helper.make_node("Mul", ["c", "s"], ["y"])], [spatial])
    rewritten, report = _rewritten(model, default_names())
    assert _ops(rewritten) == ["Conv", "Mul"]
    assert "not per output channel" in report.refused["fuse_conv_scale_bias"]["conv"]
    shared = _conv_model([helper.make_node("Mul", ["c", "k"], ["m"]), helper.make_node("Add", ["c", "m"], ["y"])],
                         [numpy_helper.from_array(np.array(2.0, np.float32), "k")])
    assert _ops(_rewritten(shared, default_names())[0]) == ["Conv", "Mul", "Add"]  # c has two readers
    divided = _conv_model([helper.make_node("Div", ["k", "c"], ["y"])],
                          [numpy_helper.from_array(np.array(2.0, np.float32), "k")])
    assert _ops(_rewritten(divided, default_names())[0]) == ["Conv", "Div"]  # k / conv is not affine


@pytest.mark.parametrize(("shape", "fused"), [([2, 12], True), (["N", 12], False)])
def test_consecutive_reshapes_with_a_static_result_become_one(shape: list, fused: bool) -> None:
    target = numpy_helper.from_array(np.array([-1, 3, 4], np.int64), "target")
    axes = numpy_helper.from_array(np.array([1], np.int64), "axes")
    nodes = [helper.make_node("Reshape", ["x", "target"], ["r"]), helper.make_node("Unsqueeze", ["r", "axes"], ["y"])]
    model = _model(nodes, shape, [shape[0], 1, 3, 4], [target, axes])
    model = onnx.shape_inference.infer_shapes(model)
    rewritten, _report = _rewritten(model, ["fuse_reshape_chain"])
    assert _ops(rewritten) == (["Reshape"] if fused else ["Reshape", "Unsqueeze"])
    x = RNG.standard_normal((2, 12)).astype(np.float32)
    np.testing.assert_array_equal(_run(rewritten, x), _run(model, x))


def _average_pool(kernel: int, *, ceil_mode: int = 1, pads: tuple[int, ...] = (0, 0, 0, 0)) -> onnx.ModelProto:
    """x [1, 4, 5, 5] -> AveragePool(kernel x kernel, stride kernel): transformers' EfficientNet pooling form."""
    return _model([helper.make_node("AveragePool", ["x"], ["y"], kernel_shape=[kernel, kernel],
                                    strides=[kernel, kernel], ceil_mode=ceil_mode, count_include_pad=1,
                                    pads=list(pads))], [1, 4, 5, 5], None)


def test_an_average_pool_over_its_whole_input_becomes_global_and_openvino_reads_it() -> None:
    """OpenVINO refused to read transformers' EfficientNet (a 2560-wide window over a 2x2 map); ONNX Runtime
    computes the map's mean, which GlobalAveragePool is."""
    import openvino as ov

    model = _average_pool(16)
    x = RNG.standard_normal((1, 4, 5, 5)).astype(np.float32)
    rewritten, report = _rewritten(onnx.shape_inference.infer_shapes(model), default_names())
    assert [node.op_type for node in rewritten.graph.node] == ["GlobalAveragePool"]
    assert report.as_findings()["applied"] == {"whole_window_average_pool": 1}
    np.testing.assert_allclose(_run(rewritten, x), _run(model, x), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(_run(rewritten, x)[0, :, 0, 0], x[0].mean(axis=(1, 2)), rtol=1e-5, atol=1e-6)
    with pytest.raises(Exception, match=r"AveragePool|AvgPool"):
        ov.Core().read_model(model.SerializeToString(), b"")
    ov.Core().read_model(rewritten.SerializeToString(), b"")


@pytest.mark.parametrize(("kernel", "ceil_mode", "pads"), [(3, 1, (0, 0, 0, 0)), (5, 1, (1, 1, 1, 1)),
                                                           (5, 0, (0, 0, 0, 0))])
def test_average_pools_that_are_not_one_window_stay(kernel: int, ceil_mode: int, pads: tuple[int, ...]) -> None:
    rewritten, _ = _rewritten(onnx.shape_inference.infer_shapes(_average_pool(kernel, ceil_mode=ceil_mode,
                                                                              pads=pads)), default_names())
    if (kernel, pads) == (5, (0, 0, 0, 0)):  # a 5x5 window over 5x5, no pads: one window, also global
        assert [node.op_type for node in rewritten.graph.node] == ["GlobalAveragePool"]
    else:
        assert [node.op_type for node in rewritten.graph.node] == ["AveragePool"]


def _concat(inputs: list[str], axis: int, inits: list[onnx.TensorProto], y_shape: list[int]) -> onnx.ModelProto:
    return _model([helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Concat", inputs, ["y"], axis=axis)],
                  [1, 3, 4], y_shape, inits)


@pytest.mark.parametrize("axis", [1, -2])
def test_empty_concat_inputs_are_dropped_and_a_lone_input_becomes_an_identity(axis: int) -> None:
    """brainmaze's spindle detector concatenates an empty ConstantOfShape: quantized, OpenVINO could not read it."""
    empty = numpy_helper.from_array(np.zeros((1, 0, 4), np.float32), "empty")
    full = numpy_helper.from_array(RNG.standard_normal((1, 2, 4)).astype(np.float32), "full")
    x = RNG.standard_normal((1, 3, 4)).astype(np.float32)
    for inputs, kept, y_shape in ((["r", "empty", "full"], ["Relu", "Concat"], [1, 5, 4]),
                                  (["empty", "r"], ["Relu", "Identity"], [1, 3, 4])):
        model = onnx.shape_inference.infer_shapes(_concat(inputs, axis, [empty, full], y_shape))
        rewritten, report = _rewritten(model, default_names())
        assert _ops(rewritten) == kept and report.as_findings()["applied"] == {"drop_empty_concat_inputs": 1}
        assert "empty" not in rewritten.graph.node[-1].input
        np.testing.assert_array_equal(_run(rewritten, x), _run(model, x))


def test_concat_inputs_of_unknown_or_nonzero_length_stay() -> None:
    model = _concat(["r", "x"], 1, [], [1, 6, 4])  # no shape inference: r's length is unknown
    assert _ops(_rewritten(model, default_names())[0]) == ["Relu", "Concat"]
    empty_elsewhere = numpy_helper.from_array(np.zeros((0, 3, 4), np.float32), "e")  # empty along axis 0
    model = onnx.shape_inference.infer_shapes(_concat(["r", "e"], 0, [empty_elsewhere], [1, 3, 4]))
    assert _ops(_rewritten(model, default_names())[0]) == ["Relu", "Identity"]
    model = onnx.shape_inference.infer_shapes(_concat(["r", "x"], 1, [], [1, 6, 4]))
    assert _ops(_rewritten(model, default_names())[0]) == ["Relu", "Concat"]
