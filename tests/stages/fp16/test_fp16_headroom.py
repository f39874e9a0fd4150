"""The fp16 stage's own check must not promise more than true float16 gives on other draws of the same inputs.

Three classes, each with a small graph:
- a calibration sample whose own SNR the pooled SNR hides (``_draws``);
- a sigmoid's tail: an absolute float16 error before it becomes a relative error of the output, whose energy
  sits in the few largest elements, so the SNR changes with the draw; a calibration draw that passes by less
  than the headroom repairs the artifact (``_headroom``);
- a bias that cancels most of its Gemm's product (a BatchNormalization folded in): true float16 rounds the
  product before adding the bias, and the emulation now does so too (``_bias``).

Each artifact is validated on draws the stage never saw, with onnx's reference evaluator (true float16).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import helper

from qdeploy.core.compare import compare_outputs
from qdeploy.core.context import StageResult
from qdeploy.core.tolerance import DEFAULT_TOLERANCES, Tolerance
from qdeploy.stages.fp16._headroom import with_headroom
from tests.helpers.fp16 import const, make_model, run_ort, run_reference, run_stage, tensor

Feeds = list[dict[str, np.ndarray]]
TOLERANCE = DEFAULT_TOLERANCES["fp16"]


def _draw(seed: int, low: float, high: float, shape: tuple[int, ...], count: int = 4) -> Feeds:
    rng = np.random.default_rng(seed)
    return [{"x": rng.uniform(low, high, shape).astype(np.float32)} for _ in range(count)]


def _exact(values: np.ndarray) -> np.ndarray:
    """Values float16 holds exactly: only the arithmetic rounds, not the data or the weights."""
    return values.astype(np.float16).astype(np.float32)


def _stage(folder: Path, model: onnx.ModelProto, calibration: Feeds, **config: object) -> StageResult:
    folder.mkdir()
    return run_stage(folder, model, {"cal": calibration}, calibration={"data": "cal"}, **config)


def _on_reference(model: onnx.ModelProto, artifact: onnx.ModelProto, feeds: Feeds) -> float:
    """The SNR (dB) of the artifact under true float16 arithmetic against float32 on the feeds, pooled."""
    expected = [{"y": run_ort(model, feed)[0]} for feed in feeds]
    measured = [{"y": run_reference(artifact, feed)[0]} for feed in feeds]
    snr = compare_outputs(expected, measured, TOLERANCE).worst()["snr_db"]
    assert snr is not None
    return snr


def _sigmoid_tail() -> onnx.ModelProto:
    """y = sigmoid(x * 120 - 127) for x in [0, 1]: the output lives in the tail (below 1e-3), where float16's
    rounding of x * 120 (steps of 1/16 near 120) is a relative error of the few largest outputs."""
    nodes = [helper.make_node("Mul", ["x", "gain"], ["scaled"], name="gain"),
             helper.make_node("Add", ["scaled", "offset"], ["logits"], name="offset"),
             helper.make_node("Sigmoid", ["logits"], ["y"], name="probability")]
    return make_model(nodes, [const("gain", 120.0), const("offset", -127.0)], [tensor("x", [1, 64])],
                      [tensor("y", [1, 64])])


def test_a_calibration_draw_that_passes_by_less_than_the_headroom_is_repaired_for_other_draws(
        tmp_path: Path) -> None:
    model = _sigmoid_tail()
    calibration = _draw(1, 0.0, 1.0, (1, 64))
    others = {seed: _draw(seed, 0.0, 1.0, (1, 64)) for seed in (0, 2, 7)}

    unrepaired = _stage(tmp_path / "a", model, calibration, repair=False)
    assert unrepaired.findings.fidelity["emulated"]["passed"] is True  # the calibration draw passes...
    assert 30.0 < unrepaired.findings.fidelity["emulated"]["worst"]["snr_db"] < 36.0  # ...by less than 6 dB
    assert unrepaired.findings.budget is None
    assert min(_on_reference(model, unrepaired.model, feeds) for feeds in others.values()) < 30.0  # others miss

    result = _stage(tmp_path / "b", model, calibration)
    for seed, feeds in others.items():
        assert _on_reference(model, result.model, feeds) >= 30.0, seed
    emulated = result.findings.fidelity["emulated"]
    assert emulated["headroom"]["db"] == 6.0 and emulated["headroom"]["met"] is True
    assert emulated["headroom"]["target"]["snr_db_min"] == 36.0
    assert "6 dB headroom" in result.findings.budget["trigger"]
    assert "gain" in {entry["node"] for entry in result.findings.kept_in_fp32}  # the rounding that matters


def _offset_and_back() -> onnx.ModelProto:
    """y = (x + 1000) - 1000: float16 keeps x + 1000 to steps of 0.5 whatever x is, so a quiet input (|x| <= 1)
    loses what a loud one (|x| ~ 100) keeps."""
    nodes = [helper.make_node("Add", ["x", "offset"], ["shifted"], name="shift"),
             helper.make_node("Sub", ["shifted", "offset"], ["y"], name="unshift")]
    return make_model(nodes, [const("offset", 1000.0)], [tensor("x", [1, 64])], [tensor("y", [1, 64])])


def test_a_calibration_sample_the_pooled_snr_hides_is_repaired(tmp_path: Path) -> None:
    """Pooled over a loud and a quiet sample the SNR is the loud one's (44 dB); the quiet one alone is far
    below the tolerance, and so is any quiet draw: each sample must meet the target on its own."""
    model = _offset_and_back()
    calibration = _draw(1, -100.0, 100.0, (1, 64), count=1) + _draw(2, -1.0, 1.0, (1, 64), count=1)
    quiet = _draw(3, -1.0, 1.0, (1, 64), count=2)

    result = _stage(tmp_path / "a", model, calibration)
    assert _on_reference(model, result.model, quiet) >= 30.0
    assert "shift" in {entry["node"] for entry in result.findings.kept_in_fp32}
    assert "sample 1:" in result.findings.budget["trigger"]
    assert result.findings.budget["searched"].startswith("each sample on its own")


def _cancelling_gemm() -> onnx.ModelProto:
    """y = x @ W + b for x in [8, 9]: the product is near 550 and the bias takes all but a few units of it off,
    as a BatchNormalization folded into a layer does (weights and bias exact in float16)."""
    rng = np.random.default_rng(0)
    weights = _exact(1.0 + 0.1 * rng.standard_normal((64, 16)))
    bias = _exact(-8.5 * weights.sum(axis=0))
    nodes = [helper.make_node("Gemm", ["x", "W", "b"], ["y"], name="dense")]
    return make_model(nodes, [const("W", weights), const("b", bias)], [tensor("x", [1, 64])], [tensor("y", [1, 16])])


def test_the_emulation_rounds_a_product_before_its_bias_as_true_float16_does(tmp_path: Path) -> None:
    model = _cancelling_gemm()
    calibration = [{"x": _exact(feed["x"])} for feed in _draw(1, 8.0, 9.0, (1, 64))]
    unseen = [{"x": _exact(feed["x"])} for feed in _draw(3, 8.0, 9.0, (1, 64))]
    plain = _stage(tmp_path / "a", model, calibration, repair=False)
    emulated = plain.findings.fidelity["emulated"]["worst"]["snr_db"]
    true_float16 = _on_reference(model, plain.model, calibration)
    assert true_float16 < 30.0  # the float16 Gemm loses the result under true float16 arithmetic...
    assert abs(emulated - true_float16) < 3.0  # ...and the emulation says so (it said > 60 dB before)
    assert plain.findings.fidelity["emulated"]["passed"] is False

    repaired = _stage(tmp_path / "b", model, calibration)
    assert "dense" in {entry["node"] for entry in repaired.findings.kept_in_fp32}
    assert _on_reference(model, repaired.model, unseen) >= 30.0


def test_headroom_tightens_every_error_limit_by_the_same_power() -> None:
    tight = with_headroom(Tolerance(cosine_min=0.999, snr_db_min=30.0, atol=0.1, rtol=0.01,
                                    top1_agreement_min=0.9), 10.0)
    assert tight.snr_db_min == 40.0
    assert np.isclose(1.0 - tight.cosine_min, 1e-4) and np.isclose(tight.atol, 0.1 / np.sqrt(10.0))
    assert np.isclose(tight.rtol, 0.01 / np.sqrt(10.0)) and tight.top1_agreement_min == 0.9
    assert with_headroom(TOLERANCE, 0.0) == TOLERANCE
