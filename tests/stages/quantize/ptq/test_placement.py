"""Where ptq puts its Q/DQ pairs for each runtime, decided without calibrating (``per_runtime: auto``), and the
calibration the two builds of one variant share."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper

from qdeploy.stages import quantize
from qdeploy.stages.quantize import QuantizeConfig
from qdeploy.stages.quantize.ptq._placement import placeholder_ranges, placement_differences, quantized_placement
from tests.helpers.quantize import (
    concat_head,
    init,
    make_model,
    openvino_agrees_with_ort,
    save_artifact,
    stage_context,
    tiny_conv,
)


def _mlp() -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"], name="mm1"),
             helper.make_node("Relu", ["h"], ["r"], name="relu"),
             helper.make_node("MatMul", ["r", "w2"], ["y"], name="mm2")]
    return make_model(nodes, [init("w1", rng.standard_normal((16, 32))), init("w2", rng.standard_normal((32, 8)))],
                      {"x": [1, 16]}, {"y": [1, 8]})


@pytest.mark.parametrize(("model", "signed", "differs_at"), [
    # OpenVINO: Q after the Relu, not between Conv and Relu; no Q/DQ pair for the Flatten of pooled values
    (tiny_conv, "auto", {"conv1", "conv2", "relu1", "relu2", "flatten", "fc"}),
    # the same places; OpenVINO reads the signed input on int8, the Relu's output stays uint8 on both
    (_mlp, "auto", {"mm1"}),
    (_mlp, "asymmetric", set()),  # no convolution, no float tail, no zero point to drop: one graph serves both
])
def test_the_placement_decision_finds_the_nodes_the_runtimes_quantize_differently(
        tmp_path: Path, model: object, signed: str, differs_at: set[str]) -> None:
    artifact = save_artifact(tmp_path, model())  # type: ignore[operator]
    found = placement_differences(artifact.path, QuantizeConfig(signed_activations=signed), tmp_path)
    assert set(found) == differs_at



def test_a_model_quantized_already_is_not_quantized_again_to_compare_placements(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The stage refuses such a model; comparing placements ran ORT's quantizer on it twice first (its warnings on
    the user's terminal), and the decision must not fail on it."""
    from qdeploy.stages.quantize.ptq import _ptq

    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"], name="q"),
             helper.make_node("DequantizeLinear", ["q", "s", "z"], ["dq"], name="dq"),
             helper.make_node("MatMul", ["dq", "w1"], ["y"], name="mm")]
    model = make_model(nodes, [init("s", np.array(0.1)), onnx.numpy_helper.from_array(np.array(0, np.uint8), "z"),
                               init("w1", np.ones((16, 8)))], {"x": [1, 16]}, {"y": [1, 8]})
    artifact = save_artifact(tmp_path, model)
    monkeypatch.setattr(_ptq, "StaticBuilder", lambda *a, **k: pytest.fail("quantized a quantized model"))
    assert placement_differences(artifact.path, QuantizeConfig(signed_activations="auto"), tmp_path) == []


def test_the_quantizers_root_logger_warnings_go_to_the_debug_log(caplog: pytest.LogCaptureFixture,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    import logging

    from qdeploy.stages.quantize.ptq import _ptq

    # loggers no CLI run of the suite configured (qdeploy's may stop propagating to the capture)
    monkeypatch.setattr(_ptq, "log", logging.getLogger("test_placement.ptq"))
    caplog.set_level(logging.DEBUG)
    with _ptq.quiet():
        logging.warning("Bias of Gemm node 'g' is not constant. Please exclude this node for better performance.")
        logging.getLogger("test_placement.ours").warning("ours")  # a named logger's warnings still reach the user
    logging.warning("after")  # the filter is gone with the context
    warned = [(r.name, r.getMessage()) for r in caplog.records if r.levelno >= logging.WARNING]
    assert warned == [("test_placement.ours", "ours"), ("root", "after")]
    assert any("Bias of Gemm node 'g'" in r.getMessage() and r.levelno == logging.DEBUG for r in caplog.records)

def test_placeholder_signs_follow_the_graph() -> None:
    """Never negative: a Relu's output and what pooling, data movement and a Concat of such values make of it,
    a Clip from 0; anything else may be negative."""
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[2]),
             helper.make_node("Concat", ["p", "x"], ["mixed"], axis=1),
             helper.make_node("Concat", ["p", "r"], ["both"], axis=1),
             helper.make_node("Clip", ["x", "zero"], ["clipped"]), helper.make_node("Clip", ["x", "low"], ["neg"]),
             helper.make_node("Add", ["r", "r"], ["sum"])]
    model = helper.make_model(helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 2, 4])], [],
        [init("zero", np.float32(0.0)), init("low", np.float32(-1.0))]))
    ranges = placeholder_ranges(model, ["x", "r", "p", "mixed", "both", "clipped", "neg", "sum"])
    assert {name for name, (low, _) in ranges.items() if low == 0} == {"r", "p", "both", "clipped"}


def test_the_openvino_build_puts_signed_activations_on_int8_with_zero_point_zero(tmp_path: Path) -> None:
    """runtime openvino: the signed input's Q/DQ is int8 with zero point 0, the Relu's output stays uint8; the ORT
    build and signed_activations: asymmetric keep uint8 with a zero point."""
    artifact = save_artifact(tmp_path, _mlp())
    types = {}
    for label, settings in {"ort": {"runtime": "ort"}, "openvino": {"runtime": "openvino"},
                            "asymmetric": {"runtime": "openvino", "signed_activations": "asymmetric"}}.items():
        model = quantize.run(artifact, QuantizeConfig(reduce_range="weights", **settings),
                             stage_context(tmp_path)).model
        zero_points = {init.name: onnx.numpy_helper.to_array(init) for init in model.graph.initializer}
        types[label] = {node.input[0]: (str(zero_points[node.input[2]].dtype), int(zero_points[node.input[2]]))
                        for node in model.graph.node if node.op_type == "QuantizeLinear"}
    assert types["openvino"]["x"] == ("int8", 0) and types["openvino"]["r"] == ("uint8", 0)
    for label in ("ort", "asymmetric"):
        assert types[label]["x"][0] == "uint8" and types[label]["x"][1] > 0 and types[label]["r"] == ("uint8", 0)


def test_the_decision_matches_the_calibrated_builds(tmp_path: Path) -> None:
    """Placeholder ranges place the Q/DQ pairs where calibrated ones do."""
    artifact = save_artifact(tmp_path, tiny_conv())
    built = {runtime: quantize.run(artifact, QuantizeConfig(runtime=runtime, reduce_range="weights"),
                                   stage_context(tmp_path)).model for runtime in ("ort", "openvino")}
    ort, openvino = (quantized_placement(model) for model in built.values())
    assert sorted(name for name in ort.keys() | openvino.keys() if ort.get(name) != openvino.get(name)) \
        == placement_differences(artifact.path, QuantizeConfig(), tmp_path / "decide")


def test_the_two_runtime_builds_of_a_variant_calibrate_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from qdeploy.stages.quantize.ptq import _ptq

    calls = []
    real = _ptq.calibrate
    monkeypatch.setattr(_ptq, "calibrate", lambda *args, **kwargs: calls.append(1) or real(*args, **kwargs))
    artifact = save_artifact(tmp_path, tiny_conv())
    for settings in ({"runtime": "ort"}, {"runtime": "openvino"}):
        quantize.run(artifact, QuantizeConfig(reduce_range="weights", **settings), stage_context(tmp_path))
    assert len(calls) == 1  # the openvino build read the ort build's ranges
    quantize.run(artifact, QuantizeConfig(reduce_range="weights", method="percentile"), stage_context(tmp_path))
    quantize.run(artifact, QuantizeConfig(reduce_range="weights"), stage_context(tmp_path, ranges={"x": (0.0, 1.0)}))
    assert len(calls) == 3  # other settings, other samples: calibrated again


def _identity() -> onnx.ModelProto:
    """x @ I: the weights are exact on int8, so the input's rounding is all the error."""
    return make_model([helper.make_node("MatMul", ["x", "eye"], ["y"], name="mm")], [init("eye", np.eye(16))],
                      {"x": [1, 16]}, {"y": [1, 16]})


@pytest.mark.parametrize(("model", "input_range", "symmetric"), [
    (_identity, (-3.0, 3.0), "all"),  # centred: int8 costs nothing, nothing to measure
    (_identity, (-0.05, 10.0), "centred"),  # lopsided and all the error: int8 would lose 6 dB
    (_mlp, (-0.05, 10.0), "all"),  # lopsided, but the Relu's and the weights' rounding dominate: within 1 dB
])
def test_auto_puts_signed_activations_on_int8_unless_it_costs_accuracy(
        tmp_path: Path, model: object, input_range: tuple[float, float], symmetric: str) -> None:
    """signed_activations auto, OpenVINO's build: a range centred on zero goes on int8 with zero point 0; a lopsided
    one too unless the graph with it on int8 is more than 1 dB SNR further from float32 than with it on uint8."""
    artifact = save_artifact(tmp_path, model())  # type: ignore[operator]
    result = quantize.run(artifact, QuantizeConfig(runtime="openvino", reduce_range="weights"),
                          stage_context(tmp_path, ranges={"x": input_range}))
    record = result.report()["signed_activations"]
    assert record["setting"] == "auto" and record["symmetric"] == symmetric, record
    if "measured" in record:
        measured = {name: value["snr_db"] for name, value in record["measured"].items()}
        assert (measured["all"] >= measured["centred"] - 1.0) is (symmetric == "all"), measured
    else:
        assert input_range[0] == -input_range[1]  # measured wherever a range is lopsided
    zero_points = {init.name: onnx.numpy_helper.to_array(init) for init in result.model.graph.initializer}
    quantize_x = next(node for node in result.model.graph.node
                      if node.op_type == "QuantizeLinear" and node.input[0] == "x")
    assert zero_points[quantize_x.input[2]].dtype == (np.uint8 if symmetric == "centred" else np.int8)


def test_seven_bit_activations_stay_unsigned(tmp_path: Path) -> None:
    """An int8 kernel without VNNI shifts int8 inputs to uint8: 7-bit signed values would be 8 bits again."""
    artifact = save_artifact(tmp_path, _mlp())
    result = quantize.run(artifact, QuantizeConfig(runtime="openvino", reduce_range="activations",
                                                   signed_activations="symmetric"), stage_context(tmp_path))
    assert result.report()["signed_activations"]["symmetric"] == "none"
    assert all(init.data_type != onnx.TensorProto.INT8 for init in result.model.graph.initializer
               if init.name.endswith("zero_point") and "x" in init.name)


def _input_quantization(model: onnx.ModelProto, tensor: str = "x") -> tuple[np.ndarray, np.ndarray]:
    """The scale and zero point of the QuantizeLinear that reads ``tensor`` (the graph input by default)."""
    values = {init.name: onnx.numpy_helper.to_array(init) for init in model.graph.initializer}
    node = next(node for node in model.graph.node if node.op_type == "QuantizeLinear" and node.input[0] == tensor)
    return values[node.input[1]], values[node.input[2]]


@pytest.mark.parametrize(("variant", "targets"), [("v@openvino", ("ort:cpu", "openvino:cpu")),
                                                  ("v", ("openvino:cpu",))])
def test_seven_bit_activations_beside_signed_ones_where_only_openvino_runs_the_graph(
        tmp_path: Path, variant: str, targets: tuple[str, ...]) -> None:
    """A graph only OpenVINO runs (its per-runtime build, or OpenVINO targets only): oneDNN halves a convolution's
    weights for an int8 input on CPUs without VNNI rather than saturate, so the convolution's signed input goes on
    int8 with all 8 bits (the scale of a build with 8-bit activations) while the Relu's output keeps 7 bits."""
    artifact = save_artifact(tmp_path, tiny_conv())
    context = dataclasses.replace(stage_context(tmp_path, ranges={"x": (-2.0, 2.0)}), variant=variant,
                                  targets=targets)
    built = {form: quantize.run(artifact, QuantizeConfig(runtime="openvino", reduce_range=form), context)
             for form in ("activations", "weights")}
    assert built["activations"].report()["signed_activations"]["symmetric"] == "all"
    scale, zero_point = _input_quantization(built["activations"].model)
    assert zero_point.dtype == np.int8 and zero_point == 0
    assert scale == pytest.approx(_input_quantization(built["weights"].model)[0], rel=1e-6)
    relu_scale, relu_zero_point = _input_quantization(built["activations"].model, "r1")
    assert relu_zero_point.dtype == np.uint8  # the Relu's output on 0..127, not 0..255
    assert relu_scale == pytest.approx(_input_quantization(built["weights"].model, "r1")[0] * 255 / 127, rel=1e-5)
    auto = quantize.run(artifact, QuantizeConfig(runtime="openvino"), context).report()["reduce_range"]
    assert auto["margin_db"] == 0.25  # no uint8 input for 7-bit activations to pay for there


def test_beside_seven_bit_activations_only_a_convolution_input_goes_on_int8(tmp_path: Path) -> None:
    """OpenVINO-only, 7-bit activations: a MatMul's signed input stays uint8 on 7 bits (oneDNN is not known to
    halve the weights of its other int8 kernels), and the record says why."""
    artifact = save_artifact(tmp_path, _mlp())
    context = dataclasses.replace(stage_context(tmp_path, ranges={"x": (-2.0, 2.0)}), variant="v@openvino")
    result = quantize.run(artifact, QuantizeConfig(runtime="openvino", reduce_range="activations"), context)
    record = result.report()["signed_activations"]
    assert record["symmetric"] == "none" and "convolution input" in record["why"], record
    assert _input_quantization(result.model)[1].dtype == np.uint8


def test_seven_bit_activations_stay_unsigned_where_onnx_runtime_may_run_the_graph(tmp_path: Path) -> None:
    """The same build with an ONNX Runtime target beside OpenVINO's: its kernels without VNNI shift int8 to uint8,
    and 8 bits would saturate there."""
    artifact = save_artifact(tmp_path, _mlp())
    context = dataclasses.replace(stage_context(tmp_path), targets=("ort:cpu", "openvino:cpu"))
    result = quantize.run(artifact, QuantizeConfig(runtime="openvino", reduce_range="activations"), context)
    assert result.report()["signed_activations"]["symmetric"] == "none"
    assert _input_quantization(result.model)[1].dtype == np.uint8


def test_openvino_builds_hold_seven_bit_activations_to_the_signed_margin(tmp_path: Path) -> None:
    """7-bit activations keep every signed activation uint8 with a zero point, which OpenVINO runs slower: its
    build chooses them only 1 dB closer to float32 than 7-bit weights, ONNX Runtime's at 0.25 dB."""
    artifact = save_artifact(tmp_path, tiny_conv())
    margins = {}
    for runtime in ("ort", "openvino"):
        report = quantize.run(artifact, QuantizeConfig(runtime=runtime), stage_context(tmp_path)).report()
        record = report["reduce_range"]
        margins[runtime] = record["margin_db"]
        snr = {form: value["snr_db"] for form, value in record["measured"].items()}
        assert (record["seven_bit"] == "activations") is (snr["activations"] > snr["weights"] + record["margin_db"])
    assert margins == {"ort": 0.25, "openvino": 1.0}


def test_nothing_to_sign_when_no_activation_is_negative(tmp_path: Path) -> None:
    """OpenVINO's build of a graph whose quantized activations are all Relu outputs: uint8 with zero point 0, one
    build (no int8 candidate to make or measure)."""
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"), helper.make_node("MatMul", ["r", "w"], ["y"])]
    weight = np.random.default_rng(0).standard_normal((16, 8))
    artifact = save_artifact(tmp_path, make_model(nodes, [init("w", weight)], {"x": [1, 16]}, {"y": [1, 8]}))
    report = quantize.run(artifact, QuantizeConfig(runtime="openvino", reduce_range="weights"),
                          stage_context(tmp_path)).report()
    assert report["signed_activations"] == {"setting": "auto", "symmetric": "none",
                                            "why": "no activation it quantizes is ever negative"}


def test_the_seven_bit_and_signed_choices_share_their_builds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """OpenVINO's build with the 7-bit choice: 7-bit weights are compared as they would ship (centred signed
    activations on int8), and that graph is the one kept: two quantizer passes where nothing is lopsided."""
    from qdeploy.stages.quantize.ptq import _ptq

    made: list[float] = []

    class Counted(_ptq.StaticBuilder):  # type: ignore[misc]
        def __init__(self, *args: object, **kwargs: object) -> None:
            made.append(float(kwargs.get("signed_int8", 0.0)))  # type: ignore[arg-type]
            super().__init__(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(_ptq, "StaticBuilder", Counted)
    artifact = save_artifact(tmp_path, tiny_conv())
    context = stage_context(tmp_path, ranges={"x": (-1.0, 1.0)})
    report = quantize.run(artifact, QuantizeConfig(runtime="openvino"), context).report()
    assert report["reduce_range"]["seven_bit"] in ("weights", "activations")
    assert sorted(made) == [0.0, _ptq.CENTRED], made  # 7-bit activations unsigned, 7-bit weights centred
    assert report["signed_activations"]["symmetric"] in ("all", "none")


def test_what_a_concat_reads_or_writes_stays_uint8_in_openvino_builds(tmp_path: Path) -> None:
    """OpenVINO's CPU plugin computes a convolution reading a Concat of int8 tensors wrongly on AVX512-VNNI CPUs
    without AMX: every tensor linked to the Concat (through the MaxPool too) keeps uint8 with a zero point while the
    graph input still goes on int8; and the graph OpenVINO runs agrees with ONNX Runtime's on this machine."""

    artifact = save_artifact(tmp_path, concat_head())
    context = stage_context(tmp_path, ranges={"x": (-2.0, 2.0)})
    model = quantize.run(artifact, QuantizeConfig(runtime="openvino", reduce_range="weights",
                                                  signed_activations="symmetric"), context).model
    assert _input_quantization(model)[1].dtype == np.int8
    quantized = {node.input[0] for node in model.graph.node if node.op_type == "QuantizeLinear"}
    linked = {tensor: _input_quantization(model, tensor)[1].dtype for tensor in ("y1", "p1", "y2", "cat")
              if tensor in quantized}
    assert {"y1", "y2"} <= set(linked) and set(linked.values()) == {np.dtype(np.uint8)}, linked
    assert openvino_agrees_with_ort(model) > 0.999


@pytest.mark.parametrize(("variant", "targets", "openvino_runs"), [
    ("v", ("ort:cpu", "openvino:cpu"), True), ("v@openvino", ("ort:cpu", "openvino:cpu"), True),
    ("v", ("ort:cpu",), False), ("v@ort", ("ort:cpu", "openvino:cpu"), False)])
def test_activation_type_int8_keeps_a_concats_tensors_uint8_wherever_openvino_runs_the_graph(
        tmp_path: Path, variant: str, targets: tuple[str, ...], openvino_runs: bool) -> None:
    """``activation_type: int8``: the Concat's tensors go back on uint8 where OpenVINO may run the graph (and the
    report says so), OpenVINO then agrees with ONNX Runtime; a graph only ONNX Runtime runs keeps int8 throughout."""
    artifact = save_artifact(tmp_path, concat_head())
    context = dataclasses.replace(stage_context(tmp_path, ranges={"x": (-2.0, 2.0)}), variant=variant,
                                  targets=targets)
    runtime = variant.partition("@")[2] or None
    result = quantize.run(artifact, QuantizeConfig(activation_type="int8", runtime=runtime), context)
    model = result.model
    quantized = {node.input[0] for node in model.graph.node if node.op_type == "QuantizeLinear"}
    linked = {tensor: _input_quantization(model, tensor)[1].dtype for tensor in ("y1", "p1", "y2", "cat")
              if tensor in quantized}
    assert _input_quantization(model)[1].dtype == np.int8  # the graph input is no Concat's: the recipe's type
    want = np.dtype(np.uint8 if openvino_runs else np.int8)
    assert {"y1", "y2"} <= set(linked) and set(linked.values()) == {want}, linked
    note = result.report()["signed_activations"].get("uint8_at_concats", "")
    assert " tensors a Concat reads or writes stay uint8" in note if openvino_runs else note == "", note
    if openvino_runs:
        assert openvino_agrees_with_ort(model) > 0.999
