"""mode lower: OpenVINO FakeQuantize, decomposed Div-Round-Clip-Mul patterns and weight Q/DQ pairs.

Each lowered model must run on ONNX Runtime and OpenVINO and equal the fake-quant semantics, computed here
in numpy independently of qdeploy, within one quantization step (plus the difference qdeploy reports when
the source has no exact Q/DQ form).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from qdeploy.core.errors import StageError
from qdeploy.stages import quantize
from qdeploy.stages.quantize import QuantizeConfig
from tests.helpers.lowering import OV_DOMAIN, SHAPE, assert_within, covering_inputs, decomposed_nodes, ov_fake_quantize
from tests.helpers.quantize import init, make_model, producers, run_openvino, run_ort, save_artifact, stage_context


def lower(tmp_path: Path, model: onnx.ModelProto) -> quantize.StageResult:
    return quantize.run(save_artifact(tmp_path, model), QuantizeConfig(mode="lower"), stage_context(tmp_path))








# ---- OpenVINO FakeQuantize on activations --------------------------------------------------------------

S = 0.05
OV_CASES = {
    # name: (levels, input_low, input_high, output_low, output_high, exact)
    "uint8_affine_per_tensor": (256, 0.0, 255 * S, 0.0, 255 * S, True),
    "int8_symmetric_per_tensor": (256, -128 * S, 127 * S, -128 * S, 127 * S, True),
    "affine_zero_inside": (256, -37 * S, 218 * S, -37 * S, 218 * S, True),
    "output_range_twice_the_input": (256, -128 * S, 127 * S, -256 * S, 254 * S, True),
    "narrow_symmetric": (255, -127 * S, 127 * S, -127 * S, 127 * S, False),
    "four_bits": (16, -8 * S, 7 * S, -8 * S, 7 * S, False),
    "zero_off_grid": (256, -0.0137, 255 * S - 0.0137, -0.0137, 255 * S - 0.0137, False),
}


def ov_activation_model(levels: int, il: object, ih: object, ol: object, oh: object) -> onnx.ModelProto:
    node = helper.make_node("FakeQuantize", ["x", "il", "ih", "ol", "oh"], ["y"], name="fq", domain=OV_DOMAIN,
                            levels=levels)
    inits = [init("il", il), init("ih", ih), init("ol", ol), init("oh", oh)]
    return make_model([node], inits, {"x": SHAPE}, ["y"], domains=(OV_DOMAIN,))


@pytest.mark.parametrize("case", list(OV_CASES))
def test_openvino_fake_quantize_on_activations(tmp_path: Path, case: str) -> None:
    levels, il, ih, ol, oh, exact = OV_CASES[case]
    result = lower(tmp_path, ov_activation_model(levels, il, ih, ol, oh))
    assert [node.op_type for node in result.model.graph.node] == ["QuantizeLinear", "DequantizeLinear"]
    assert all(opset.domain != OV_DOMAIN for opset in result.model.opset_import)
    site = result.findings.sites[0]
    assert (site["rule"], site["kind"], site["per_channel"]) == ("openvino_fake_quantize", "activation", False)
    assert site["exact"] is exact
    assert (site["max_difference"] == 0.0) is exact
    if not exact:
        assert result.findings.inexact["count"] == 1
        assert 0.0 < result.findings.inexact["largest_difference"] <= (oh - ol) / (levels - 1) * (1 + 1e-5)
    assert result.findings.verification["failures"] == []
    step = (oh - ol) / (levels - 1)
    for x in covering_inputs(il, ih):
        expected = ov_fake_quantize(x.astype(np.float64), il, ih, ol, oh, levels)
        allowed = site["max_difference"] + step
        assert_within(run_ort(result.model, {"x": x})[0], expected, allowed)
        assert_within(run_openvino(result.model, {"x": x}, tmp_path)[0], expected, allowed)


def test_openvino_fake_quantize_per_channel_activation(tmp_path: Path) -> None:
    steps = S * np.array([1.0, 2.0, 0.5, 1.0]).reshape(1, 4, 1, 1)
    il = -np.array([51, 20, 0, 100]).reshape(1, 4, 1, 1) * steps  # zero on each channel's grid
    ih = il + 255 * steps
    result = lower(tmp_path, ov_activation_model(256, il, ih, il, ih))
    quantize_node = result.model.graph.node[0]
    assert quantize_node.op_type == "QuantizeLinear"
    assert helper.get_attribute_value(quantize_node.attribute[0]) == 1  # axis 1: channels of NCHW
    scales = {item.name: numpy_helper.to_array(item) for item in result.model.graph.initializer}
    assert scales[quantize_node.input[1]].shape == (4,)
    assert result.findings.sites[0]["per_channel"] and result.findings.sites[0]["exact"]
    for x in covering_inputs(float(il.min()), float(ih.max())):
        expected = ov_fake_quantize(x.astype(np.float64), il, ih, il, ih, 256)
        assert_within(run_ort(result.model, {"x": x})[0], expected, float(np.max((ih - il) / 255)))
        assert_within(run_openvino(result.model, {"x": x}, tmp_path)[0], expected, float(np.max((ih - il) / 255)))


# ---- weights: OpenVINO FakeQuantize per channel, folded into int8 ------------------------------------


def conv_with_weight_fake_quantize(levels: int) -> tuple[onnx.ModelProto, np.ndarray]:
    rng = np.random.default_rng(0)
    weight = (rng.standard_normal((6, 4, 3, 3)) * 0.2).astype(np.float32)
    high = np.abs(weight).reshape(6, -1).max(axis=1).reshape(6, 1, 1, 1)
    low = -high if levels == 255 else -high * 128 / 127
    nodes = [helper.make_node("FakeQuantize", ["x", "al", "ah", "al", "ah"], ["xq"], name="fq_x", domain=OV_DOMAIN,
                              levels=256),
             helper.make_node("FakeQuantize", ["w", "wl", "wh", "wl", "wh"], ["wq"], name="fq_w", domain=OV_DOMAIN,
                              levels=levels),
             helper.make_node("Conv", ["xq", "wq"], ["y"], name="conv", pads=[1, 1, 1, 1])]
    inits = [init("w", weight), init("wl", low), init("wh", high), init("al", 0.0), init("ah", 255 * 0.02)]
    expected_weight = ov_fake_quantize(weight.astype(np.float64), low, high, low, high, levels)
    return make_model(nodes, inits, {"x": SHAPE}, ["y"], domains=(OV_DOMAIN,)), expected_weight


@pytest.mark.parametrize("levels", [255, 256])
def test_weight_fake_quantize_is_folded_into_symmetric_int8(tmp_path: Path, levels: int) -> None:
    model, expected_weight = conv_with_weight_fake_quantize(levels)
    result = lower(tmp_path, model)
    made_by = producers(result.model)
    conv = next(node for node in result.model.graph.node if node.op_type == "Conv")
    weight_dq = made_by[conv.input[1]]
    assert weight_dq.op_type == "DequantizeLinear"
    inits = {item.name: numpy_helper.to_array(item) for item in result.model.graph.initializer}
    data, scale, zero = (inits[name] for name in weight_dq.input)
    assert data.dtype == np.int8 and zero.dtype == np.int8 and not zero.any() and scale.shape == (6,)
    dequantized = (data.astype(np.float64) - zero.reshape(6, 1, 1, 1)) * scale.reshape(6, 1, 1, 1)
    np.testing.assert_allclose(dequantized, expected_weight, rtol=1e-6, atol=1e-7)
    weight_site = next(site for site in result.findings.sites if site["kind"] == "weight")
    assert weight_site["symmetric"] and weight_site["exact"] and weight_site["per_channel"]
    assert result.findings.int8_kernels["openvino:cpu"]["int8_layers"] == {"Convolution": 1}


# ---- decomposed Div/Mul - Round - Clip - Mul patterns ---------------------------------------------------




def decomposed_reference(x: np.ndarray, scale: np.ndarray, low: float, high: float, zero: float = 0.0) -> np.ndarray:
    return (np.clip(np.round(x / scale + zero), low, high) - zero) * scale


DECOMPOSED_CASES = {
    # name: (divide, clip bounds, zero point, zero added after Round, expected dtype, exact)
    "uint8_affine_div": (True, (0, 255), 37.0, False, np.uint8, True),
    "uint8_affine_zero_after_round": (True, (0, 255), 37.0, True, np.uint8, True),
    "int8_symmetric_mul": (False, (-128, 127), None, False, np.int8, True),
    "int8_narrow_range": (True, (-127, 127), None, False, np.int8, False),
}


@pytest.mark.parametrize("case", list(DECOMPOSED_CASES))
def test_decomposed_pattern_on_activations(tmp_path: Path, case: str) -> None:
    divide, (low, high), zero, after, dtype, exact = DECOMPOSED_CASES[case]
    scale = 0.04
    nodes = decomposed_nodes("x", "y", scale="s", divide=divide, clip=("lo", "hi"), zero="zp" if zero else None,
                             zero_after_round=after)
    inits = [init("s", scale), init("s_inv", 1 / scale), init("lo", low), init("hi", high)]
    inits += [init("zp", zero)] if zero else []
    result = lower(tmp_path, make_model(nodes, inits, {"x": SHAPE}, ["y"]))
    assert [node.op_type for node in result.model.graph.node] == ["QuantizeLinear", "DequantizeLinear"]
    zero_point = next(numpy_helper.to_array(item) for item in result.model.graph.initializer
                      if item.name == result.model.graph.node[0].input[2])
    assert zero_point.dtype == dtype and int(zero_point) == int(zero or 0)
    site = result.findings.sites[0]
    assert site["rule"] == "decomposed_fake_quant" and site["exact"] is exact
    assert len(site["nodes"]) == len(nodes)
    for x in covering_inputs((low - (zero or 0)) * scale, (high - (zero or 0)) * scale):
        expected = decomposed_reference(x.astype(np.float64), scale, low, high, zero or 0.0)
        assert_within(run_ort(result.model, {"x": x})[0], expected, site["max_difference"] + scale)
        assert_within(run_openvino(result.model, {"x": x}, tmp_path)[0], expected, site["max_difference"] + scale)


def test_decomposed_per_channel_weights_fold_into_per_axis_int8(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    weight = (rng.standard_normal((6, 4, 3, 3)) * 0.3).astype(np.float32)
    scale = (np.abs(weight).reshape(6, -1).max(axis=1) / 127).reshape(6, 1, 1, 1).astype(np.float32)
    nodes = [*decomposed_nodes("w", "wq", scale="ws", divide=True, clip=("lo", "hi")),
             helper.make_node("Conv", ["x", "wq"], ["y"], name="conv", pads=[1, 1, 1, 1])]
    inits = [init("w", weight), init("ws", scale), init("ws_inv", 1 / scale), init("lo", -127), init("hi", 127)]
    model = make_model(nodes, inits, {"x": SHAPE}, ["y"])
    result = lower(tmp_path, model)
    assert [node.op_type for node in result.model.graph.node] == ["DequantizeLinear", "Conv"]
    dq = result.model.graph.node[0]
    assert helper.get_attribute_value(dq.attribute[0]) == 0
    x = np.random.default_rng(2).standard_normal(SHAPE).astype(np.float32)
    expected_weight = decomposed_reference(weight.astype(np.float64), scale, -127, 127)
    reference = make_model([helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])],
                           [init("w", expected_weight)], {"x": SHAPE}, ["y"])
    expected = run_ort(reference, {"x": x})[0]
    np.testing.assert_allclose(run_ort(result.model, {"x": x})[0], expected, atol=1e-5)
    np.testing.assert_allclose(run_openvino(result.model, {"x": x}, tmp_path)[0], expected, atol=1e-4)
    assert result.findings.sites[0]["exact"] and result.findings.sites[0]["symmetric"]


def test_decomposed_pattern_below_opset_13_is_converted_first(tmp_path: Path) -> None:
    """Per-axis QuantizeLinear needs opset 13: an opset-11 model is converted, then lowered."""
    nodes = decomposed_nodes("x", "y", scale="s", divide=True, clip=("lo", "hi"))
    model = make_model(nodes, [init("s", 0.02), init("lo", 0), init("hi", 255)], {"x": SHAPE}, ["y"], opset=11)
    result = lower(tmp_path, model)
    assert [node.op_type for node in result.model.graph.node] == ["QuantizeLinear", "DequantizeLinear"]
    assert next(o.version for o in result.model.opset_import if o.domain == "") >= 13
    x = covering_inputs(0.0, 255 * 0.02)[0]
    assert_within(run_ort(result.model, {"x": x})[0], decomposed_reference(x.astype(np.float64), 0.02, 0, 255), 0.02)


def test_decomposed_pattern_with_a_run_time_scale_is_refused_and_left_alone(tmp_path: Path) -> None:
    nodes = [helper.make_node("ReduceMax", ["x"], ["m"], keepdims=0),
             helper.make_node("Div", ["m", "levels"], ["s"]),
             *decomposed_nodes("x", "y", scale="s", divide=True, clip=("lo", "hi"))]
    inits = [init("levels", 127.0), init("lo", -128), init("hi", 127)]
    result = lower(tmp_path, make_model(nodes, inits, {"x": SHAPE}, ["y"]))
    assert result.findings.lowered == {}
    assert result.findings.refused[0]["rule"] == "decomposed_fake_quant"
    assert "computed at run time" in result.findings.refused[0]["reason"]
    assert "Round" in {node.op_type for node in result.model.graph.node}
    assert result.changed is False


# ---- QuantizeLinear on float weights -------------------------------------------------------------------


def test_weight_quantize_linear_is_folded_into_an_int8_initializer(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    weight = (rng.standard_normal((6, 4, 3, 3)) * 0.2).astype(np.float32)
    scale = (np.abs(weight).reshape(6, -1).max(axis=1) / 127).astype(np.float32)
    nodes = [helper.make_node("QuantizeLinear", ["w", "ws", "wz"], ["wq"], name="q_w", axis=0),
             helper.make_node("DequantizeLinear", ["wq", "ws", "wz"], ["wd"], name="dq_w", axis=0),
             helper.make_node("Conv", ["x", "wd"], ["y"], name="conv", pads=[1, 1, 1, 1])]
    model = make_model(nodes, [init("w", weight), init("ws", scale), init("wz", np.zeros(6), np.int8)],
                       {"x": SHAPE}, ["y"])
    result = lower(tmp_path, model)
    assert [node.op_type for node in result.model.graph.node] == ["DequantizeLinear", "Conv"]
    folded = next(item for item in result.model.graph.initializer if item.name == result.model.graph.node[0].input[0])
    assert folded.data_type == onnx.TensorProto.INT8
    assert not any(item.name == "w" for item in result.model.graph.initializer)
    x = rng.standard_normal(SHAPE).astype(np.float32)
    expected = run_ort(model, {"x": x})[0]
    np.testing.assert_allclose(run_ort(result.model, {"x": x})[0], expected, atol=1e-6)
    np.testing.assert_allclose(run_openvino(result.model, {"x": x}, tmp_path)[0], expected, atol=1e-4)
    assert result.findings.lowered == {"fold_weight_quantize_linear": 1}


# ---- what cannot be lowered ----------------------------------------------------------------------------


@pytest.mark.parametrize(("node", "named"), [
    (helper.make_node("MyFakeQuant", ["x"], ["y"], name="acme_fq", domain="com.acme"), "acme_fq"),
    (helper.make_node("ATen", ["x"], ["y"], name="aten_fq", domain="org.pytorch.aten",
                      operator="fake_quantize_per_tensor_affine"), "aten_fq"),
])
def test_unknown_fake_quant_ops_are_reported_by_name(tmp_path: Path, node: onnx.NodeProto, named: str) -> None:
    model = make_model([node], [], {"x": SHAPE}, ["y"], domains=(node.domain,))
    with pytest.raises(StageError, match=rf"{named} \({node.domain}::{node.op_type}\)"):
        lower(tmp_path, model)


def test_fake_quantize_with_run_time_ranges_is_refused(tmp_path: Path) -> None:
    node = helper.make_node("FakeQuantize", ["x", "il", "ih", "il", "ih"], ["y"], name="fq", domain=OV_DOMAIN,
                            levels=256)
    model = make_model([helper.make_node("ReduceMin", ["x"], ["il"], keepdims=0), node], [init("ih", 1.0)],
                       {"x": SHAPE}, ["y"], domains=(OV_DOMAIN,))
    with pytest.raises(StageError, match=r"fq \(org.openvinotoolkit::FakeQuantize\)"):
        lower(tmp_path, model)


def test_lowered_qdq_pairs_own_their_scale_and_zero_point(tmp_path: Path) -> None:
    """Two fake-quant sites reading one scale and zero point (as a QAT export shares them along a padded chain)
    lower to Q/DQ nodes that each read constants of their own: OpenVINO's PadTransformation rewrites a shared
    zero-point constant for all its readers at once (docs/quantize.md, "Padded sequences on OpenVINO")."""
    scale = 0.04
    nodes = [*decomposed_nodes("x", "y1", scale="s", divide=True, clip=("lo", "hi"), zero="zp"),
             helper.make_node("Pad", ["y1", "pads"], ["p"], mode="constant"),
             *decomposed_nodes("p", "y", scale="s", divide=True, clip=("lo", "hi"), zero="zp")]
    inits = [init("s", scale), init("lo", 0.0), init("hi", 255.0), init("zp", 128.0),
             numpy_helper.from_array(np.array([0, 0, 0, 2, 0, 0, 0, 0], np.int64), "pads")]
    result = lower(tmp_path, make_model(nodes, inits, {"x": SHAPE}, ["y"]))
    qdq = [node for node in result.model.graph.node if node.op_type in ("QuantizeLinear", "DequantizeLinear")]
    assert len(qdq) == 4
    parameters = [name for node in qdq for name in node.input[1:]]
    assert len(parameters) == len(set(parameters)), parameters
    x = covering_inputs(-128 * scale, 127 * scale)[0]
    assert_within(run_openvino(result.model, {"x": x}, tmp_path)[0], run_ort(result.model, {"x": x})[0], 1e-6)


@pytest.mark.parametrize(("targets", "kind"), [(("ort:cpu", "openvino:cpu"), onnx.TensorProto.UINT8),
                                               (("ort:cpu",), onnx.TensorProto.INT8)])
def test_int8_fake_quantize_at_a_concat_lowers_to_uint8_where_openvino_runs_the_graph(
        tmp_path: Path, targets: tuple[str, ...], kind: int) -> None:
    """OpenVINO miscomputes a convolution reading a Concat of int8 tensors on VNNI CPUs without AMX: the pairs there
    move to uint8 (zero point + 128, the same values), only where OpenVINO may run the graph; the report says so."""
    import dataclasses

    scale = 0.04
    nodes = [*decomposed_nodes("x0", "a", scale="s", divide=True, clip=("lo", "hi"), zero="zp"),
             *decomposed_nodes("x1", "b", scale="s", divide=True, clip=("lo", "hi"), zero="zp"),
             helper.make_node("Concat", ["a", "b"], ["y"], axis=1)]
    inits = [init("s", scale), init("lo", -128.0), init("hi", 127.0), init("zp", 0.0)]
    model = make_model(nodes, inits, {"x0": SHAPE, "x1": SHAPE}, ["y"])
    context = dataclasses.replace(stage_context(tmp_path), targets=targets)
    result = quantize.run(save_artifact(tmp_path, model), QuantizeConfig(mode="lower"), context)
    types = {init.name: init.data_type for init in result.model.graph.initializer}
    assert [types[node.input[2]] for node in result.model.graph.node if node.op_type == "QuantizeLinear"] == [kind] * 2
    assert (result.findings.uint8_at_concats is not None) == (kind == onnx.TensorProto.UINT8)
    x = covering_inputs(-128 * scale, 127 * scale)[0]
    expected = np.concatenate([decomposed_reference(x, np.float64(scale), -128.0, 127.0)] * 2, axis=1)
    assert_within(run_ort(result.model, {"x0": x, "x1": x})[0], expected, 1e-6)
