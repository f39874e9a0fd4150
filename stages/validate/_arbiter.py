"""Whose float32 is off: a float64 evaluation arbitrates a float32 row that fails its float32 limits.

A float32 artifact (the reference itself on another target, the noise floor of ``_floor``, or a simplified copy on
any target) is held to the float32 limits against the reference's ``ort:cpu`` outputs.  When it fails, the
reference may be the one that is off: ONNX Runtime's Sigmoid computes its tail as 0.5 minus a value, in steps of
2.98e-8 (the float32 spacing at 0.5), so a wake-word model's probability near 1e-5 comes out half a percent off on
``ort:cpu`` (49.5 dB SNR), while OpenVINO at f32 agrees with float64 arithmetic to 1e-7.  A detector's score map
near 1e-7 is all such steps (PP-OCRv4 seal det on images without a seal: the original itself 7.5 dB SNR from
float64 on ``ort:cpu``), so a simplified copy there whose logits moved by 2e-4 lands on other steps (cosine 0.85
against the original).  Blaming the row for the reference's own error would fail a faithful artifact.

So the reference is also evaluated in float64 (``qdeploy.graph.widen``: onnx's reference evaluator) on the
samples where the two disagree most.  The row passes, and says so (its metrics stay those against ``ort:cpu``;
``arbitrated`` holds both sides against float64), where it holds the float32 limits against float64 and the
reference does not (verdict ``reference``), or where neither does and the row is no further from float64 than
the reference, within ``NO_FURTHER_DB`` of its SNR (verdict ``both, the row no further``: the limits are below the
reference runtime's own float32 error there).  Otherwise the failure stands, with what float64 showed, or why it
could not be evaluated (an op onnx.reference lacks, a model too large for numpy's pace): never a pass without
evidence.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from qdeploy.core.compare import compare_outputs
from qdeploy.core.files import external_data_files
from qdeploy.core.onnx_wire import load_model
from qdeploy.graph.widen import to_float64
from qdeploy.stages.validate._common import worst_samples
from qdeploy.targets.evaluator import build_evaluator, run_evaluator

if TYPE_CHECKING:
    from qdeploy.stages.validate._common import Feeds, Outcome, Outputs

__all__ = ["ARBITER_SAMPLES", "NO_FURTHER", "NO_FURTHER_DB", "Float64Reference", "arbitrate"]

log = logging.getLogger(__name__)

ARBITER_SAMPLES = 2
"""Samples evaluated in float64: those where the row and the reference disagree most."""
ARBITER_MAX_BYTES = 64_000_000
"""A larger reference is not evaluated in float64 (onnx.reference is numpy, one op at a time: minutes)."""
AGAINST = "float64 (onnx.reference)"
NO_FURTHER_DB = 1.0
"""Where neither side holds the limits against float64: the row's SNR against it may be this much below the
reference's and still count as no further (two samples' worth of the same rounding steps)."""
NO_FURTHER = "both, the row no further"


def arbitrate(outcome: Outcome, truth: Float64Reference, reference_outputs: Outputs,
              reference_label: str) -> Outcome:
    """A failed float32 row, arbitrated (module docstring): passed where only ort:cpu misses the limits against
    float64, else still failed; either way with ``arbitrated`` and a warning saying what float64 showed."""
    if outcome.row.status != "failed" or outcome.outputs is None or outcome.tolerance is None:
        return outcome
    _arbitrate(outcome, truth, reference_outputs, reference_label)
    return outcome


class Float64Reference:
    """The reference's float64 outputs per sample, evaluated on demand and kept for the other rows;
    ``failure`` says why they cannot be."""

    def __init__(self, path: Path, feeds: Feeds) -> None:
        self.path, self.feeds = path, feeds
        self.failure = ""
        self._evaluator: Any = None
        self._outputs: dict[int, dict[str, np.ndarray]] = {}

    def outputs(self, indices: list[int]) -> list[dict[str, np.ndarray]] | None:
        try:
            for index in indices:
                if index not in self._outputs:
                    self._outputs[index] = self._run(self.feeds[index])
        except Exception as exc:  # any evaluator failure: the row stays unarbitrated, said why
            self.failure = self.failure or " ".join(f"{type(exc).__name__}: {exc}".split())[:300]
        return None if self.failure else [self._outputs[index] for index in indices]

    def _run(self, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if self._evaluator is None:
            size = sum(path.stat().st_size for path in (self.path, *external_data_files(self.path)))
            if size > ARBITER_MAX_BYTES:
                raise ValueError(f"the reference is {size / 1e6:.0f} MB, beyond the {ARBITER_MAX_BYTES / 1e6:.0f} MB "
                                 "evaluated in float64")
            model = to_float64(load_model(self.path))
            self._evaluator = build_evaluator(model)
            self._names = [value.name for value in model.graph.output]
        widened = {name: value.astype(np.float64) if value.dtype == np.float32 else value
                   for name, value in feed.items()}
        results = run_evaluator(self._evaluator, widened)
        return {name: np.asarray(value) for name, value in zip(self._names, results, strict=True)}


def _arbitrate(outcome: Outcome, truth: Float64Reference, reference_outputs: Outputs, reference_label: str) -> None:
    row, outputs, tolerance = outcome.row, outcome.outputs, outcome.tolerance
    assert outputs is not None and tolerance is not None
    count = min(len(truth.feeds), len(outputs), len(reference_outputs))
    indices = worst_samples(reference_outputs[:count], outputs[:count], ARBITER_SAMPLES)
    exact = truth.outputs(indices)
    if exact is None:
        outcome.row = row.replace(
            warnings=[*row.warnings, f"not arbitrated: the reference could not be evaluated in float64 to tell "
                                     f"whose float32 is off ({truth.failure})"],
            arbitrated={"against": AGAINST, "samples": 0, "verdict": "unchecked", "reason": truth.failure})
        return
    target = compare_outputs(exact, [outputs[index] for index in indices], tolerance, outcome.per_output,
                             outcome.detections)
    reference = compare_outputs(exact, [reference_outputs[index] for index in indices], tolerance, outcome.per_output,
                                outcome.detections)
    verdict = ("reference" if target.passed and not reference.passed else
               "target" if reference.passed and not target.passed else "both" if not target.passed else "neither")
    if verdict == "both" and _no_further(target, reference):
        verdict = NO_FURTHER
    record = {"against": AGAINST, "samples": len(indices), "verdict": verdict,
              "target": _summary(target), "reference": _summary(reference)}
    sides = (f"against {AGAINST} on the {len(indices)} sample(s) where they disagree most, {row.target} "
             f"{_said(target)} and the reference {reference_label} on ort:cpu {_said(reference)}")
    passes = {"reference": f"ort:cpu's own float32 is what is off: {row.reason}; {sides}, so this row passes",
              NO_FURTHER: f"the limits are below ort:cpu's own float32 error here: {row.reason}; {sides}; this row "
                          f"is no further from float64 than the reference, so it passes"}.get(verdict)
    if passes:
        outcome.row = row.replace(status="passed", reason="", arbitrated=record, warnings=[
            *row.warnings, f"{passes} (its metrics stay those against ort:cpu)"])
    else:
        outcome.row = row.replace(arbitrated=record, warnings=[*row.warnings, f"arbitrated: {sides}"])
    log.info("%s on %s, float64 arbitration: %s", row.variant, row.target, verdict)


def _no_further(target: Any, reference: Any) -> bool:
    """The row's worst SNR against float64 within ``NO_FURTHER_DB`` of the reference's (both finite: a NaN never
    passes)."""
    worst = target.worst()
    mine, theirs = worst.get("snr_db"), reference.worst().get("snr_db")
    numbers = isinstance(mine, float) and isinstance(theirs, float) and bool(np.isfinite(mine) and np.isfinite(theirs))
    return numbers and mine >= theirs - NO_FURTHER_DB and not worst.get("nonfinite")


def _summary(comparison: Any) -> dict[str, Any]:
    worst = comparison.worst()
    return {"passed": comparison.passed, "cosine": worst.get("cosine"), "snr_db": worst.get("snr_db"),
            "max_abs_err": worst.get("max_abs_err"), "reasons": comparison.reasons[:3]}


def _said(comparison: Any) -> str:
    worst = comparison.worst()
    snr = worst.get("snr_db")
    level = f"{snr:.1f} dB SNR" if isinstance(snr, float) and np.isfinite(snr) else "identical"
    return f"holds the limits ({level})" if comparison.passed else f"does not ({level}: {comparison.reasons[0]})"
