"""mode lower: OneFlow's fake_quantization with its observers, and a model that mixes every form.

References are written here from the frameworks' definitions, independently of qdeploy's own numpy
references; the mixed model is evaluated with onnx's reference evaluator and custom-op kernels.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper
from onnx.reference import ReferenceEvaluator
from onnx.reference.op_run import OpRun

from qdeploy.stages import quantize
from qdeploy.stages.quantize import QuantizeConfig
from tests.helpers.int8 import exact_int8, run_ort_unfused
from tests.helpers.lowering import OV_DOMAIN, SHAPE, assert_within, covering_inputs, decomposed_nodes, ov_fake_quantize
from tests.helpers.quantize import init, make_model, run_openvino, run_ort, save_artifact, stage_context

OF_DOMAIN = "oneflow"


def lower(tmp_path: Path, model: onnx.ModelProto) -> quantize.StageResult:
    return quantize.run(save_artifact(tmp_path, model), QuantizeConfig(mode="lower"), stage_context(tmp_path))


def oneflow_weight(weight: np.ndarray, per_layer: bool, scheme: str) -> np.ndarray:
    """min_max_observer then fake_quantization (google formula, 8 bits), as OneFlow's kernels compute them."""
    rows = weight.reshape(1 if per_layer else weight.shape[0], -1).astype(np.float64)
    shape = (-1,) + (1,) * (weight.ndim - 1)
    if scheme == "symmetric":
        scale = (np.abs(rows).max(axis=1) / 127).reshape(shape)
        return np.clip(np.rint(weight / scale), -128, 127) * scale
    low, high = rows.min(axis=1), rows.max(axis=1)
    scale = ((high - low) / 255).reshape(shape)
    zero = np.rint(-low.reshape(shape) / scale)
    return (np.clip(np.rint(weight / scale + zero), 0, 255) - zero) * scale


def observed_weight_nodes(scheme: str, per_layer: bool) -> list[onnx.NodeProto]:
    settings = {"quantization_bit": 8, "quantization_scheme": scheme, "quantization_formula": "google"}
    return [helper.make_node("min_max_observer", ["w"], ["ws", "wz"], name="observer", domain=OF_DOMAIN,
                             per_layer_quantization=int(per_layer), **settings),
            helper.make_node("fake_quantization", ["w", "ws", "wz"], ["wq"], name="fq_w", domain=OF_DOMAIN,
                             **settings)]


@pytest.mark.parametrize(("scheme", "per_layer"), [("symmetric", True), ("symmetric", False), ("affine", True),
                                                   ("affine", False)])
def test_oneflow_weights_with_min_max_observer(tmp_path: Path, scheme: str, per_layer: bool) -> None:
    rng = np.random.default_rng(0)
    weight = (rng.standard_normal((6, 4, 3, 3)) * 0.2 + 0.05).astype(np.float32)
    nodes = [*observed_weight_nodes(scheme, per_layer),
             helper.make_node("Conv", ["x", "wq"], ["y"], name="conv", pads=[1, 1, 1, 1])]
    result = lower(tmp_path, make_model(nodes, [init("w", weight)], {"x": SHAPE}, ["y"], domains=(OF_DOMAIN,)))
    assert [node.op_type for node in result.model.graph.node] == ["DequantizeLinear", "Conv"]
    assert result.findings.lowered == {"oneflow_observer": 1, "oneflow_fake_quantization": 1}
    site = next(site for site in result.findings.sites if site.get("kind") == "weight")
    assert site["exact"] and site["per_channel"] is not per_layer and site["symmetric"] is (scheme == "symmetric")
    reference = make_model([helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])],
                           [init("w", oneflow_weight(weight, per_layer, scheme))], {"x": SHAPE}, ["y"])
    x = rng.standard_normal(SHAPE).astype(np.float32)
    np.testing.assert_allclose(run_ort(result.model, {"x": x})[0], run_ort(reference, {"x": x})[0], atol=1e-5)
    np.testing.assert_allclose(run_openvino(result.model, {"x": x}, tmp_path)[0], run_ort(reference, {"x": x})[0],
                               atol=1e-4)


@pytest.mark.parametrize(("scheme", "moving_max", "moving_min"), [("symmetric", 3.0, 3.0), ("affine", 5.0, -1.1)])
def test_oneflow_activations_with_moving_average_observer(tmp_path: Path, scheme: str, moving_max: float,
                                                          moving_min: float) -> None:
    settings = {"quantization_bit": 8, "quantization_scheme": scheme, "quantization_formula": "google"}
    nodes = [helper.make_node("moving_average_min_max_observer", ["x", "step", "mmax", "mmin"], ["s", "z"],
                              name="observer", domain=OF_DOMAIN, training=0, momentum=0.95,
                              stop_update_after_iters=1, **settings),
             helper.make_node("fake_quantization", ["x", "s", "z"], ["y"], name="fq_x", domain=OF_DOMAIN, **settings)]
    inits = [init("step", 0, np.int64), init("mmax", [moving_max]), init("mmin", [moving_min])]
    result = lower(tmp_path, make_model(nodes, inits, {"x": SHAPE}, ["y"], domains=(OF_DOMAIN,)))
    assert [node.op_type for node in result.model.graph.node] == ["QuantizeLinear", "DequantizeLinear"]
    if scheme == "symmetric":
        scale, zero, low, high = moving_max / 127, 0.0, -128, 127
    else:
        scale = (moving_max - moving_min) / 255
        zero, low, high = float(np.round(-moving_min / scale)), 0, 255
    for x in covering_inputs((low - zero) * scale, (high - zero) * scale):
        expected = (np.clip(np.rint(x.astype(np.float64) / scale + zero), low, high) - zero) * scale
        assert_within(run_ort(result.model, {"x": x})[0], expected, scale)
        assert_within(run_openvino(result.model, {"x": x}, tmp_path)[0], expected, scale)


def test_oneflow_cambricon_power_of_two_scale(tmp_path: Path) -> None:
    settings = {"quantization_bit": 8, "quantization_scheme": "symmetric", "quantization_formula": "cambricon"}
    node = helper.make_node("fake_quantization", ["x", "shift", "zero"], ["y"], name="fq", domain=OF_DOMAIN,
                            **settings)
    result = lower(tmp_path, make_model([node], [init("shift", [-5.0]), init("zero", [0.0])], {"x": SHAPE}, ["y"],
                                        domains=(OF_DOMAIN,)))
    step = 2.0 ** -5
    scales = [numpy_helper.to_array(item) for item in result.model.graph.initializer if "scale" in item.name]
    assert all(float(scale) == step for scale in scales)
    x = covering_inputs(-128 * step, 127 * step)[0]
    assert_within(run_ort(result.model, {"x": x})[0], np.clip(np.rint(x / step), -128, 127) * step, step)


def test_observer_in_training_mode_is_refused(tmp_path: Path) -> None:
    settings = {"quantization_bit": 8, "quantization_scheme": "symmetric", "quantization_formula": "google"}
    nodes = [helper.make_node("moving_average_min_max_observer", ["x", "step", "mmax", "mmin"], ["s", "z"],
                              name="observer", domain=OF_DOMAIN, training=1, **settings),
             helper.make_node("fake_quantization", ["x", "s", "z"], ["y"], name="fq_x", domain=OF_DOMAIN, **settings)]
    inits = [init("step", 0, np.int64), init("mmax", [3.0]), init("mmin", [3.0])]
    with pytest.raises(quantize.StageError, match=r"observer .*training mode"):
        lower(tmp_path, make_model(nodes, inits, {"x": SHAPE}, ["y"], domains=(OF_DOMAIN,)))


# ---- a model mixing every form ----------------------------------------------------------------------


class FakeQuantize(OpRun):  # the class name is the op type the evaluator maps
    op_domain = OV_DOMAIN

    def _run(self, x, il, ih, ol, oh, levels=None):
        return (ov_fake_quantize(x.astype(np.float64), il, ih, ol, oh, levels).astype(np.float32),)


class min_max_observer(OpRun):
    op_domain = OF_DOMAIN

    def _run(self, x, quantization_bit=None, quantization_scheme=None, quantization_formula=None,
             per_layer_quantization=None):
        rows = x.reshape(1 if per_layer_quantization else x.shape[0], -1)
        return ((np.abs(rows).max(axis=1) / 127).astype(np.float32), np.zeros(len(rows), np.float32))


class fake_quantization(OpRun):
    op_domain = OF_DOMAIN

    def _run(self, x, scale, zero, quantization_bit=None, quantization_scheme=None,
             quantization_formula=None):
        scale = scale.reshape((-1,) + (1,) * (x.ndim - 1)) if scale.size > 1 else scale
        return ((np.clip(np.rint(x / scale), -128, 127) * scale).astype(np.float32),)


def mixed_model() -> onnx.ModelProto:
    """OpenVINO FakeQuantize on the input, OneFlow on conv1's weight, a decomposed pattern between the
    convolutions, and a weight QuantizeLinear/DequantizeLinear pair on conv2."""
    rng = np.random.default_rng(5)
    w1 = (rng.standard_normal((8, 4, 3, 3)) * 0.2).astype(np.float32)
    w2 = (rng.standard_normal((4, 8, 3, 3)) * 0.2).astype(np.float32)
    w2_scale = (np.abs(w2).reshape(4, -1).max(axis=1) / 127).astype(np.float32)
    settings = {"quantization_bit": 8, "quantization_scheme": "symmetric", "quantization_formula": "google"}
    nodes = [helper.make_node("FakeQuantize", ["x", "al", "ah", "al", "ah"], ["xq"], name="fq_x", domain=OV_DOMAIN,
                              levels=256),
             helper.make_node("min_max_observer", ["w1"], ["w1s", "w1z"], name="observer", domain=OF_DOMAIN,
                              per_layer_quantization=0, **settings),
             helper.make_node("fake_quantization", ["w1", "w1s", "w1z"], ["w1q"], name="fq_w1", domain=OF_DOMAIN,
                              **settings),
             helper.make_node("Conv", ["xq", "w1q"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
             *decomposed_nodes("r1", "r1q", scale="rs", divide=True, clip=("lo", "hi")),
             helper.make_node("QuantizeLinear", ["w2", "w2s", "w2z"], ["w2i"], name="q_w2", axis=0),
             helper.make_node("DequantizeLinear", ["w2i", "w2s", "w2z"], ["w2q"], name="dq_w2", axis=0),
             helper.make_node("Conv", ["r1q", "w2q"], ["y"], name="conv2", pads=[1, 1, 1, 1])]
    inits = [init("al", -128 * 0.02), init("ah", 127 * 0.02), init("w1", w1), init("rs", 0.05),
             init("rs_inv", 20.0), init("lo", 0), init("hi", 255), init("w2", w2), init("w2s", w2_scale),
             init("w2z", np.zeros(4), np.int8)]
    return make_model(nodes, inits, {"x": SHAPE}, ["y"], opset=19, domains=(OV_DOMAIN, OF_DOMAIN))


def test_mixed_model_is_lowered_and_matches_its_reference_on_both_runtimes(tmp_path: Path) -> None:
    model = mixed_model()
    result = lower(tmp_path, model)
    assert {opset.domain for opset in result.model.opset_import} <= {"", "ai.onnx"}
    assert result.findings.lowered == {"oneflow_observer": 1, "oneflow_fake_quantization": 1,
                                          "openvino_fake_quantize": 1, "decomposed_fake_quant": 1,
                                          "fold_weight_quantize_linear": 1}
    assert result.findings.refused == [] and result.findings.inexact["count"] == 0
    assert result.findings.verification["checked"] == 2 and result.findings.verification["failures"] == []
    assert result.findings.verification["max_error_steps"] <= 1.0
    assert result.findings.int8_kernels["openvino:cpu"]["int8"] == 2
    assert result.findings.int8_kernels["ort:cpu"]["int8"] >= 1  # conv1: DQ -> Conv -> Relu -> Q

    evaluator = ReferenceEvaluator(model, new_ops=[FakeQuantize, min_max_observer, fake_quantization])
    exact = exact_int8()
    # the QAT weights use the full int8 range, which qdeploy must keep: CPUs without VNNI may saturate them
    assert "saturating int16" in result.findings.int8_saturation_warning
    for x in covering_inputs(-2.56, 2.54, count=3):
        expected = evaluator.run(None, {"x": x})[0].astype(np.float64)
        # the lowered graph's own arithmetic matches its fake-quant reference on every CPU
        assert_matches_reference(run_ort_unfused(result.model, {"x": x})[0], expected)
        for actual in (run_ort(result.model, {"x": x})[0], run_openvino(result.model, {"x": x}, tmp_path)[0]):
            if exact:  # VNNI or arm64: the int8 kernels compute exactly
                assert_matches_reference(actual, expected)
            else:  # AVX2/AVX512 without VNNI: vpmaddubsw's int16 pair sums clip; measured corr >= 0.984 here
                assert float(np.corrcoef(actual.ravel(), expected.ravel())[0, 1]) > 0.97


def assert_matches_reference(actual: np.ndarray, expected: np.ndarray) -> None:
    close = np.abs(actual - expected) <= 1e-3 + 1e-4 * np.abs(expected)
    assert close.mean() >= 0.99, close.mean()  # a rare tie rounds differently: one step, locally
    assert float(np.corrcoef(actual.ravel(), expected.ravel())[0, 1]) > 0.9999
