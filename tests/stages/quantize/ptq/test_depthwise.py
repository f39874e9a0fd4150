"""A scale per channel at depthwise convolution inputs whose channels differ widely, where OpenVINO runs the graph
(``stages/quantize/ptq/_depthwise.py``)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from qdeploy.calibration.ranges import TensorStats
from qdeploy.stages import quantize
from qdeploy.stages.quantize import QuantizeConfig
from qdeploy.stages.quantize.ptq._depthwise import (
    MIN_LEVELS,
    depthwise_inputs,
    per_channel_at_depthwise,
    per_tensor_at_depthwise,
)
from qdeploy.stages.quantize.ptq._keep import RESCALING
from tests.helpers.quantize import (
    depthwise_block,
    init,
    make_model,
    openvino_agrees_with_ort,
    run_ort,
    save_artifact,
    stage_context,
    static_builder,
)

FEED = {"x": np.random.default_rng(5).uniform(-2, 2, (1, 3, 16, 16)).astype(np.float32)}


def _cosine(first: np.ndarray, second: np.ndarray) -> float:
    a, b = first.ravel().astype(np.float64), second.ravel().astype(np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def _build(tmp_path: Path, model: onnx.ModelProto, variant: str,
           targets: tuple[str, ...] = ("ort:cpu", "openvino:cpu"), **settings: object) -> quantize.StageResult:
    tmp_path.mkdir(parents=True, exist_ok=True)
    artifact = save_artifact(tmp_path, model)
    context = dataclasses.replace(stage_context(tmp_path, ranges={"x": (-2.0, 2.0)}), variant=variant,
                                  targets=targets)
    runtime = variant.partition("@")[2]
    return quantize.run(artifact, QuantizeConfig(**({"runtime": runtime} if runtime else {}), **settings), context)


@pytest.mark.parametrize(("activation", "zero_type"), [("HardSwish", np.int8), ("Relu", np.uint8)])
def test_a_depthwise_input_whose_channels_differ_is_rescaled_where_openvino_runs_the_graph(
        tmp_path: Path, activation: str, zero_type: type) -> None:
    """Channels 200x apart before a depthwise convolution: OpenVINO's graph evens them out with a Mul folded into the
    convolution's weights (cosine 0.9995 against the float model, OpenVINO agreeing with ONNX Runtime), where one
    scale for the tensor leaves ONNX Runtime's graph at 0.89-0.94; the pair is int8 for a signed tensor, uint8
    for a Relu's."""
    model = depthwise_block(activation)
    expected = run_ort(model, FEED)[0]
    built = _build(tmp_path / "ov", model, "v@openvino")
    assert built.report()["per_channel_depthwise"] == ["dw"]
    gains = [node for node in built.model.graph.node if node.name.endswith(RESCALING)]
    assert len(gains) == 1 and gains[0].op_type == "Mul" and gains[0].input[0] == "a0"
    pair = next(node for node in built.model.graph.node if node.op_type == "QuantizeLinear"
                and node.input[0] == gains[0].output[0])
    zero = numpy_helper.to_array(next(i for i in built.model.graph.initializer if i.name == pair.input[2]))
    assert zero.dtype == zero_type and not zero.any()
    assert _cosine(expected, run_ort(built.model, FEED)[0]) > 0.999
    assert openvino_agrees_with_ort(built.model, FEED) > 0.999
    ort_only = _build(tmp_path / "ort", model, "v@ort")
    assert "per_channel_depthwise" not in ort_only.report()
    assert not any(node.name.endswith(RESCALING) for node in ort_only.model.graph.node)
    assert _cosine(expected, run_ort(ort_only.model, FEED)[0]) < 0.97  # what the rescaling repairs


def test_balanced_depthwise_inputs_keep_their_one_scale(tmp_path: Path) -> None:
    built = _build(tmp_path, depthwise_block(gains=(1.0, 0.8, 1.0, 0.6, 0.9, 1.0, 0.7, 1.0)), "v@openvino")
    assert "per_channel_depthwise" not in built.report()
    assert not any(node.name.endswith(RESCALING) for node in built.model.graph.node)


def test_a_shared_graph_with_an_openvino_target_is_rescaled_and_onnx_runtime_runs_it(tmp_path: Path) -> None:
    """A Relu after the depthwise convolution puts a Q right after it: ONNX Runtime fuses the pair into a
    QLinearConv, which a per-channel DequantizeLinear would make fail at run time; the rescaled form runs."""
    model = depthwise_block("Relu")
    built = _build(tmp_path, model, "v")
    assert built.report()["per_channel_depthwise"] == ["dw"]
    assert _cosine(run_ort(model, FEED)[0], run_ort(built.model, FEED)[0]) > 0.999


def _qdq_depthwise(bias: np.ndarray | None, opset: int = 17, spatial: int = 2) -> onnx.ModelProto:
    """x -> Q/DQ (one scale) -> depthwise Conv (``spatial`` axes: 2 for an image, 1 for a sequence) with int8
    weights (per-channel scales) and an int32 bias -> y."""
    channels = 4
    weights = (np.arange(channels * 3**spatial, dtype=np.int8) - 10).reshape(channels, 1, *([3] * spatial))
    nodes = [helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"], name="xq"),
             helper.make_node("DequantizeLinear", ["xq", "xs", "xz"], ["xd"], name="xd"),
             helper.make_node("DequantizeLinear", ["wq", "ws", "wz"], ["wd"], name="wd", axis=0)]
    inits = [init("xs", 0.05), init("xz", 0, np.uint8), init("wq", weights, np.int8),
             init("ws", [0.01, 0.02, 0.03, 0.04]), init("wz", [0] * channels, np.int8)]
    conv_inputs = ["xd", "wd"]
    if bias is not None:
        nodes.append(helper.make_node("DequantizeLinear", ["bq", "bs", "bz"], ["bd"], name="bd", axis=0))
        inits += [init("bq", bias, np.int32), init("bs", 0.05 * np.array([0.01, 0.02, 0.03, 0.04])),
                  init("bz", [0] * channels, np.int32)]
        conv_inputs.append("bd")
    nodes.append(helper.make_node("Conv", conv_inputs, ["y"], name="dw", group=channels, pads=[1] * 2 * spatial))
    shape = [1, channels, *([6] * spatial)]
    return make_model(nodes, inits, {"x": shape}, {"y": shape}, opset=opset)


@pytest.mark.parametrize("spatial", [2, 1])
def test_the_rescaling_is_the_same_function_in_float(spatial: int) -> None:
    """Before rounding, the rewritten graph computes what the float graph does: the weights' scales and the bias
    move with the gain (checked by replacing every Q/DQ pair of activations with the identity).  The int32 bias is
    requantized to its new scale (the new input scale x each channel's new weight scale): half a step of that is
    the only difference."""
    model = _qdq_depthwise(np.array([100, -200, 300, 5], np.int32), spatial=spatial)
    peaks = {"x": np.array([10.0, 0.02, 5.0, 0.1], np.float32)}
    assert depthwise_inputs(model) == {"x"}
    assert per_channel_at_depthwise(model, peaks) == ["dw"]
    rng = np.random.default_rng(0)
    x = (rng.uniform(-1, 1, (1, 4, *([6] * spatial))) * peaks["x"].reshape(1, 4, *([1] * spatial))).astype(
        np.float32)
    original = _qdq_depthwise(np.array([100, -200, 300, 5], np.int32), spatial=spatial)
    expected = run_ort(_without_activation_pairs(original), {"x": x})[0]
    produced = run_ort(_without_activation_pairs(model), {"x": x})[0]
    bias_scale = numpy_helper.to_array(next(i for i in model.graph.initializer if i.name == "bs"))
    np.testing.assert_allclose(produced, expected, rtol=1e-5, atol=float(bias_scale.max()) / 2 + 1e-6)
    # and with the rounding, the small channels keep their detail: each has at least MIN_LEVELS levels now
    step = float(numpy_helper.to_array(next(i for i in model.graph.initializer if i.name.endswith("_scale")
                                            and i.name.startswith("xq"))))
    gain = numpy_helper.to_array(next(i for i in model.graph.initializer if i.name.endswith("_gain"))).ravel()
    assert np.all(peaks["x"] * gain / step >= MIN_LEVELS)


def _without_activation_pairs(model: onnx.ModelProto) -> onnx.ModelProto:
    """The model with each activation Q -> DQ pair bypassed (weights and bias stay dequantized)."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    producer = {out: node for node in copy.graph.node for out in node.output}
    for node in copy.graph.node:
        if node.op_type == "Conv":
            dequantize = producer[node.input[0]]
            node.input[0] = producer[dequantize.input[0]].input[0]
    return copy


@pytest.mark.parametrize(("case", "peaks", "opset", "skip"), [
    ("balanced channels", [12.0, 6.0, 10.0, 4.0], 17, set()),  # 80 levels of the pair's step 0.05 at least
    ("a Concat's tensor", [10.0, 0.02, 5.0, 0.1], 17, {"x"}),
    ("opset 12 has no per-axis DequantizeLinear", [10.0, 0.02, 5.0, 0.1], 12, set()),
    ("peaks of another channel count", [10.0, 0.02], 17, set()),
    ("a bias beyond int32 at the new scales", [10.0, 0.02, 5.0, 0.1], 17, set()),
])
def test_what_the_rescaling_leaves_alone(case: str, peaks: list[float], opset: int, skip: set[str]) -> None:
    bias = np.array([0, 2**30, 0, 0] if "int32" in case else [1, 2, 3, 4], np.int32)  # channel 1 gains 256
    model = _qdq_depthwise(bias, opset=opset)
    before = model.SerializeToString()
    assert per_channel_at_depthwise(model, {"x": np.array(peaks, np.float32)}, skip=skip) == [], case
    assert model.SerializeToString() == before


def test_calibration_keeps_each_channels_peak_over_the_samples() -> None:
    stats = TensorStats()
    stats.update_channel_peak(np.array([[[1.0, -3.0]], [[0.5, 2.0]]], np.float32).reshape(1, 2, 2))
    stats.update_channel_peak(np.array([[[-4.0, np.inf], [0.1, 0.2]]], np.float32))
    assert stats.channel_peak is not None and stats.channel_peak.tolist() == [4.0, 2.0]
    stats.update_channel_peak(np.zeros((1, 3, 2), np.float32))  # channels that change have no per-channel range
    assert stats.channel_peak is not None and stats.channel_peak.size == 0


def test_the_gains_follow_the_channel_spread() -> None:
    """Each channel is scaled to half the largest peak (HEADROOM), by at most MOST_GAIN and never down."""
    model = _qdq_depthwise(None)
    peaks = np.array([10.0, 0.02, 5.0, 0.1], np.float32)
    per_channel_at_depthwise(model, {"x": peaks})
    gain = numpy_helper.to_array(next(i for i in model.graph.initializer if i.name.endswith("_gain"))).ravel()
    np.testing.assert_allclose(gain, [1.0, 10 / 0.04, 1.0, 10 / 0.2], rtol=1e-6)


def test_nncf_per_channel_pairs_before_a_depthwise_convolution_are_rewritten_so_onnx_runtime_runs_them(
        tmp_path: Path) -> None:
    """NNCF quantizes a depthwise convolution's input per channel; with a Relu and a Q after the convolution ONNX
    Runtime fuses that into a QLinearConv that fails at run time.  ``engine: nncf`` ships the rescaled form."""
    pytest.importorskip("nncf", reason="engine nncf is optional (pip install 'qdeploy[nncf]')")
    model = depthwise_block("Relu")
    built = _build(tmp_path, model, "v", engine="nncf")
    assert built.report()["per_tensor_depthwise"] == ["dw"]
    assert _cosine(run_ort(model, FEED)[0], run_ort(built.model, FEED)[0]) > 0.999
    assert not any(attribute.name == "axis" for node in built.model.graph.node if node.op_type == "QuantizeLinear"
                   for attribute in node.attribute)


def test_a_per_channel_pair_rewritten_as_a_rescaling_rounds_to_the_same_values() -> None:
    model = _qdq_depthwise(None)
    scales = np.array([0.08, 0.0004, 0.04, 0.0008], np.float32)
    graph = model.graph
    for name in ("xs", "xz"):
        graph.initializer.remove(next(i for i in graph.initializer if i.name == name))
    graph.initializer.extend([init("xs", scales), init("xz", [0] * 4, np.int8)])
    for node in graph.node[:2]:
        node.attribute.append(helper.make_attribute("axis", 1))
    x = (np.random.default_rng(0).uniform(-1, 1, (1, 4, 6, 6)) * scales[None, :, None, None] * 100).astype(
        np.float32)
    before = run_ort(model, {"x": x})[0]
    assert per_tensor_at_depthwise(model) == ["dw"]
    np.testing.assert_allclose(run_ort(model, {"x": x})[0], before, rtol=1e-5, atol=1e-7)


def test_a_rescaled_depthwise_convolution_kept_float_reads_its_float_input_and_leaves_no_mul(tmp_path: Path) -> None:
    """The accuracy budget keeps nodes float by feeding them their float inputs: the rescaling Mul and its pair
    go with the convolution's quantization, and the float graph's values come back."""
    model = depthwise_block("Relu")
    samples = [{"x": np.random.default_rng(seed).uniform(-2, 2, (1, 3, 16, 16)).astype(np.float32)}
               for seed in range(4)]
    builder, _ = static_builder(tmp_path, model, samples, channel_peaks=True, runtime="openvino")
    assert builder.per_channel_depthwise == ["dw"]
    assert any(node.name.endswith(RESCALING) for node in builder([]).graph.node)
    kept = builder(["dw", "conv0", "pw"])
    assert not any(node.name.endswith(RESCALING) or node.op_type == "QuantizeLinear" for node in kept.graph.node)
    np.testing.assert_allclose(run_ort(kept, FEED)[0], run_ort(model, FEED)[0], rtol=1e-5, atol=1e-5)
