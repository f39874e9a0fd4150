"""What the accuracy budget measures: candidate models against float32 on search and held-back samples (output
tolerance or task metric), and tolerances tightened by a margin.

- ``error_ratio``: how far a comparison is from its tolerance, as one number:
  the error over the allowed error, worst over the limits set (1 - cosine
  against 1 - cosine_min; noise power against the power snr_db_min allows;
  1 - top-1 agreement; max_abs_err against atol; for a detector's boxes
  matched by IoU, the share unmatched against 1 - match_min).  At most 1 passes.
- ``tightened``: the tolerance whose allowed errors are a fraction of the
  given one's: the search holds candidates to it, so that what it picks on
  the search samples keeps a margin on samples it has not seen.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from qdeploy.core.compare import OutputComparison, compare_outputs
from qdeploy.core.detections import MATCH_MIN
from qdeploy.core.tolerance import Tolerance
from qdeploy.graph.external_data import needs_external_data
from qdeploy.graph.measured_integers import measured_integers, with_integer_values
from qdeploy.stages.accuracy_budget.findings import ComparisonSummary
from qdeploy.stages.task_metric import MetricComparison, TaskJudge, metric_summary

if TYPE_CHECKING:
    import onnx

    from qdeploy.core.tolerance import TaskTolerance

__all__ = ["CannotRun", "Compare", "Evaluator", "Measured", "error_ratio", "ort_session", "summary", "tightened",
           "tightened_match", "worst_of"]

log = logging.getLogger(__name__)

Feeds = dict[str, np.ndarray]
Outputs = list[dict[str, np.ndarray]]


def error_ratio(comparison: OutputComparison, tolerance: Tolerance) -> float:
    """Error over allowed error, worst over the tolerance's limits (<= 1 passes them); inf when the comparison
    fails on something without a ratio (integer outputs that differ, NaN, a shape, an rtol limit).  A task
    metric's comparison: the drop over the allowed drop."""
    if isinstance(comparison, MetricComparison):
        return comparison.ratio()
    worst = comparison.worst()
    ratios = []
    if tolerance.cosine_min is not None and worst["cosine"] is not None:
        ratios.append(_ratio(1.0 - worst["cosine"], 1.0 - tolerance.cosine_min))
    if tolerance.snr_db_min is not None and worst["snr_db"] is not None:
        ratios.append(10.0 ** ((tolerance.snr_db_min - worst["snr_db"]) / 10.0))
    if tolerance.top1_agreement_min is not None and worst["top1_agreement"] is not None:
        ratios.append(_ratio(1.0 - worst["top1_agreement"], 1.0 - tolerance.top1_agreement_min))
    if tolerance.atol is not None and tolerance.rtol is None and worst["max_abs_err"] is not None:
        ratios.append(_ratio(worst["max_abs_err"], tolerance.atol))
    ratios.extend(_ratio(1.0 - min(out.detections["recall"], out.detections["precision"]),
                         1.0 - float((out.tolerance or {}).get("match_min", MATCH_MIN)))
                  for out in comparison.outputs if out.detections)
    worst_ratio = max(ratios, default=0.0)
    if not comparison.passed and worst_ratio <= 1.0:
        return math.inf
    return worst_ratio


def _ratio(error: float, allowed: float) -> float:
    if allowed <= 0.0:
        return 0.0 if error <= 0.0 else math.inf
    return max(error, 0.0) / allowed


def tightened(tolerance: Tolerance, fraction: float) -> Tolerance:
    """The tolerance that allows ``fraction`` of each error the given one allows."""
    limits = tolerance.model_dump()
    if limits["cosine_min"] is not None:
        limits["cosine_min"] = 1.0 - (1.0 - limits["cosine_min"]) * fraction
    if limits["snr_db_min"] is not None:
        limits["snr_db_min"] += 10.0 * math.log10(1.0 / fraction)
    if limits["top1_agreement_min"] is not None:
        limits["top1_agreement_min"] = 1.0 - (1.0 - limits["top1_agreement_min"]) * fraction
    for key in ("atol", "rtol"):
        if limits[key] is not None:
            limits[key] *= fraction
    return type(tolerance)(**limits)


def tightened_match(detections: Mapping[str, Any] | None, fraction: float) -> Mapping[str, Any] | None:
    """A detection match that allows ``fraction`` of the unmatched share the given one allows (``tightened``)."""
    if not detections or fraction >= 1.0:
        return detections
    return {**detections, "match_min": 1.0 - (1.0 - float(detections.get("match_min", MATCH_MIN))) * fraction}


def summary(comparison: OutputComparison, tolerance: Tolerance | TaskTolerance) -> ComparisonSummary:
    if isinstance(comparison, MetricComparison):
        return metric_summary(comparison)
    worst = comparison.worst()
    ratio = error_ratio(comparison, tolerance)
    found = ComparisonSummary(passed=comparison.passed, cosine=worst.get("cosine"), snr_db=worst.get("snr_db"),
                              top1_agreement=worst.get("top1_agreement"), max_abs_err=worst.get("max_abs_err"),
                              error_ratio=None if math.isinf(ratio) else ratio, reasons=comparison.reasons[:3])
    if worst.get("detections_matched") is not None:
        found["detections_matched"] = worst["detections_matched"]
    return found


@dataclass
class Measured:
    """A candidate's outputs on the search samples (and on the held-back ones when asked); ``failure``: why the
    runtime could not run it (its outputs are then empty and every comparison fails)."""

    search: Outputs
    held: Outputs | None = None
    failure: str | None = None
    unavailable: bool = False
    """The failure is the target's own limit (``CannotRun.unavailable``)."""
    compared: dict[tuple[int, str, float], OutputComparison] = field(default_factory=dict, compare=False,
                                                                     repr=False)
    """Its comparisons so far, by (reference, part, error fraction): the search asks the same one several times
    (does it pass, at which ratio, is it the best), and each is a pass over every output (or a task metric call)."""

    @property
    def held_part(self) -> bool:
        """Whether the held-back samples were measured (or their run failed)."""
        return self.held is not None and (bool(self.held) or self.failure is not None)


class CannotRun(Exception):
    """A runtime cannot load or run a candidate (OpenVINO refusing a graph): a failed measurement, not a crash;
    ``unavailable``: the target cannot run it for its own limits (onnx.reference lacking a kernel), which
    measures nothing of the candidate."""

    def __init__(self, message: str, *, unavailable: bool = False) -> None:
        super().__init__(message)
        self.unavailable = unavailable


Runner = Callable[[Path, list[list[Feeds]]], list[Outputs]]
"""Loads a model file once and runs it on each list of feeds: ONNX Runtime's CPU session for the search, a
target's own session for confirming on it (``targets``)."""
Compare = Callable[..., OutputComparison]
"""How candidate outputs are held to an output tolerance, called (reference, candidate, tolerance, detections=):
``worst_of`` (every sample, and their pool), or the pool alone (``compare_outputs``)."""


def ort_runner(path: Path, batches: list[list[Feeds]]) -> list[Outputs]:
    """The search's runtime: ONNX Runtime's CPU provider, as the ort:cpu target runs a model."""
    session = ort_session(str(path))
    return [_run(session, feeds) for feeds in batches]


class Evaluator:
    """Runs candidate models on one runtime (by default ONNX Runtime, as the ort:cpu target does) on the budget
    samples and compares them with the float model's outputs; counts evaluations and the seconds they take."""

    def __init__(self, float_model: Path | None, search: list[Feeds], held: list[Feeds], tolerance: Any,
                 work_dir: Path, *, runner: Runner = ort_runner, reference: Measured | None = None,
                 label: str = "ort:cpu", judge: TaskJudge | None = None, compare: Compare | None = None,
                 detections: Mapping[str, Any] | None = None) -> None:
        self.search_feeds, self.held_feeds = search, held
        self.detections = detections
        """A detector's outputs, matched by IoU (the stage context's ``detections``); None: compared elementwise."""
        self.compare = compare or worst_of
        self.judge = judge
        """Decides with the user's task metric instead of output similarity (``tolerance`` is then its own)."""
        if isinstance(tolerance, Tolerance) and float_model is not None:  # a cast image is compared as values
            tolerance = with_integer_values(tolerance, measured_integers(float_model))
        self.tolerance = tolerance
        self.work_dir = work_dir
        self.runner, self.label = runner, label
        if reference is None:  # float32 on ONNX Runtime, as validation's reference runs
            assert float_model is not None, "an evaluator without a float model is given its reference"
            reference = Measured(*ort_runner(float_model, [search, held]))
        self.reference = reference
        self.float_model = float_model
        self.count = 0
        self.seconds = 0.0

    def on_runtime(self, runner: Runner, label: str) -> Evaluator:
        """An evaluator of the same samples, reference and tolerance that runs candidates with ``runner``."""
        return Evaluator(self.float_model, self.search_feeds, self.held_feeds, self.tolerance, self.work_dir,
                         runner=runner, reference=self.reference, label=label, judge=self.judge,
                         compare=self.compare, detections=self.detections)

    def measure(self, model: onnx.ModelProto, *, held: bool = False, samples: int | None = None) -> Measured:
        """One evaluation: the model's outputs on the (first ``samples``) search samples, and on the held-back
        ones when asked."""
        import onnx

        started = time.perf_counter()
        self.count += 1
        path = self.work_dir / "budget_candidate.onnx"
        onnx.save(model, str(path), save_as_external_data=needs_external_data(model))
        batches = [self.search_feeds[:samples], *([self.held_feeds] if held else [])]
        try:
            outputs = self.runner(path, batches)
            measured = Measured(outputs[0], outputs[1] if held else None)
        except CannotRun as exc:
            log.info("accuracy budget: %s", exc)
            measured = Measured([], [] if held else None, failure=str(exc), unavailable=exc.unavailable)
        self.seconds += time.perf_counter() - started
        return measured

    def on_search(self, measured: Measured, fraction: float = 1.0) -> OutputComparison:
        """Compared on the search samples with the tolerance tightened to ``fraction`` of its errors."""
        if measured.failure is not None:
            return OutputComparison([], False, [measured.failure])
        key = (id(self.reference), "search", min(fraction, 1.0))
        if key not in measured.compared:
            measured.compared[key] = self._compare_search(measured, fraction)
        return measured.compared[key]

    def on_held(self, measured: Measured) -> OutputComparison:
        assert measured.held is not None
        if measured.failure is not None:
            return OutputComparison([], False, [measured.failure])
        key = (id(self.reference), "held", 1.0)
        if key not in measured.compared:
            measured.compared[key] = (
                self.judge.compare("held", self.reference.held or [], measured.held) if self.judge is not None
                else self.compare(self.reference.held or [], measured.held, self.tolerance,
                                  detections=self.detections))
        return measured.compared[key]

    def _compare_search(self, measured: Measured, fraction: float) -> OutputComparison:
        if self.judge is not None:
            return self.judge.compare("search", self.reference.search, measured.search, fraction)
        tolerance = self.tolerance if fraction >= 1.0 else tightened(self.tolerance, fraction)
        return self.compare(self.reference.search[:len(measured.search)], measured.search, tolerance,
                            detections=tightened_match(self.detections, fraction))

    def per_sample_ratios(self, measured: Measured) -> list[float]:
        if self.judge is not None:  # a task metric is a rate over samples: no per-sample spread
            return []
        if measured.failure is not None:
            return [math.inf] * len(self.reference.search)
        return [error_ratio(compare_outputs([ref], [got], self.tolerance, detections=self.detections), self.tolerance)
                for ref, got in zip(self.reference.search, measured.search, strict=True)]


def worst_of(reference: Outputs, candidate: Outputs, tolerance: Tolerance,
             detections: Mapping[str, Any] | None = None) -> OutputComparison:
    """The comparison over all samples or that of the worst single sample, whichever is further from the
    tolerance: a budget that holds on every sample holds on any few samples of the same kind (validation
    compares a handful, where one hard sample weighs as much as the rest), not only on their sum.  Top-1
    agreement, a rate over samples, is judged over all of them only; so are a detector's matched boxes
    (``detections``): a sample holds a few boxes, and one of them unmatched is no rate."""
    overall = compare_outputs(reference, candidate, tolerance, detections=detections)
    if len(reference) < 2 or detections:
        return overall
    per_sample = tolerance.model_copy(update={"top1_agreement_min": None})
    if not per_sample.model_dump(exclude_none=True):
        return overall
    samples = [compare_outputs([ref], [got], per_sample) for ref, got in zip(reference, candidate, strict=True)]
    for comparison in samples:
        for output in comparison.outputs:
            output.top1_agreement = None  # one sample's top-1 says nothing of the rate
    return max([overall, *samples], key=lambda comparison: error_ratio(comparison, tolerance))


def ort_session(path: str) -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    return ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])


def _run(session: Any, feeds: list[Feeds]) -> Outputs:
    names = [out.name for out in session.get_outputs()]
    return [dict(zip(names, session.run(names, feed), strict=True)) for feed in feeds]
