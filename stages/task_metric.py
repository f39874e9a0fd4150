"""The accuracy budget on the user's own task metric, shared by the quantize and fp16 stages:
``tolerance: {metric: "metrics.py:accuracy", max_drop: 0.01}`` (``qdeploy.core.tolerance.TaskTolerance``).

The metric is called as ``validate.metric`` is (``qdeploy.stages.validate``): ``function(outputs, labels)`` on the
samples' outputs stacked along the batch axis, with the labels of the budget data (a built-in metric such as
``perplexity``: per sample, on the logits and the text dataset's token labels).  It is computed on the float32
reference, then on each candidate: the drop (reference - candidate for a higher-is-better metric, candidate -
reference for a lower-is-better one: a perplexity rise is the drop) is held to ``max_drop`` (or
``max_relative_drop`` times the reference).  A ``MetricComparison`` stands where an output comparison would; its
error ratio is the drop over the allowed drop.  ``task_for`` loads the metric and the labels a stage needs.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from qdeploy.core.compare import OutputComparison, compare_outputs
from qdeploy.core.errors import DataError, RecipeError
from qdeploy.core.lm_metrics import Direction, metric_direction
from qdeploy.core.tolerance import TaskTolerance, Tolerance
from qdeploy.stages.accuracy_budget.findings import ComparisonSummary
from qdeploy.stages.validate import evaluate, load_metric, read_labels

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from qdeploy.core.context import DatasetInfo

__all__ = ["MetricComparison", "Task", "TaskJudge", "judged", "labels_missing", "metric_summary", "task_for"]

Outputs = list[dict[str, np.ndarray]]
REMEMBERED = 16
"""Lists of outputs whose metric value a judge remembers (each held in memory while remembered)."""
Task = tuple["Callable[[dict[str, np.ndarray], Any], Any]", list[np.ndarray]]
"""A task metric's function and one label per budget sample."""


@dataclass
class MetricComparison(OutputComparison):
    """A candidate's task metric against float32's on the same samples."""

    metric: float | None = None
    reference: float | None = None
    allowed: float = 0.0
    """The drop the tolerance allows (tightened by the search's fraction)."""
    direction: Direction = "higher"
    """Which way the metric is better: for a lower-is-better one (perplexity) a rise is the drop."""

    @property
    def drop(self) -> float | None:
        if self.metric is None or self.reference is None:
            return None
        return self.reference - self.metric if self.direction == "higher" else self.metric - self.reference

    def ratio(self) -> float:
        """Drop over allowed drop (<= 1 passes); inf when the metric could not be computed."""
        drop = self.drop
        if drop is None:
            return math.inf
        if self.allowed <= 0.0:
            return 0.0 if drop <= 1e-12 else math.inf
        return max(drop, 0.0) / self.allowed


def metric_summary(comparison: MetricComparison) -> ComparisonSummary:
    ratio = comparison.ratio()
    return ComparisonSummary(passed=comparison.passed, metric=_rounded(comparison.metric),
                             reference_metric=_rounded(comparison.reference), drop=_rounded(comparison.drop),
                             allowed_drop=_rounded(comparison.allowed),
                             error_ratio=None if math.isinf(ratio) else ratio, reasons=comparison.reasons[:3])


class TaskJudge:
    """Computes the metric on a part's outputs and compares it with float32's on the same samples."""

    def __init__(self, function: Callable[[dict[str, np.ndarray], Any], Any], tolerance: TaskTolerance,
                 labels: list[np.ndarray], search_count: int) -> None:
        self.function, self.tolerance = function, tolerance
        self.direction = metric_direction(tolerance.metric)
        self.labels = {"search": labels[:search_count], "held": labels[search_count:]}
        self.references: dict[tuple[str, int], float] = {}
        self.values: OrderedDict[tuple[str, int], tuple[Outputs, tuple[float | None, str]]] = OrderedDict()
        """The metric on the last ``REMEMBERED`` lists of outputs (kept with it, so its id is not reused): the
        search compares one candidate several times (at each error fraction); the metric runs once."""

    def reference_on(self, part: str, reference: Outputs) -> float:
        """float32's metric on the first ``len(reference)`` samples of ``part`` (cached)."""
        key = (part, len(reference))
        if key not in self.references:
            value, why = self._value(part, reference)
            if value is None:
                raise DataError(f"budget tolerance: {why} on the float32 model's outputs; the budget cannot "
                                "measure a drop from it")
            self.references[key] = value
        return self.references[key]

    def compare(self, part: str, reference: Outputs, candidate: Outputs, fraction: float = 1.0) -> MetricComparison:
        base = self.reference_on(part, reference[:len(candidate)])
        value, why = self._value(part, candidate)
        allowed = self.allowed(base) * min(fraction, 1.0)
        result = MetricComparison([], False, [why] if why else [], metric=value, reference=base, allowed=allowed,
                                  direction=self.direction)
        drop = result.drop
        result.passed = drop is not None and drop <= allowed + 1e-12
        if drop is not None and not result.passed:
            if self.direction == "higher":
                result.reasons.append(f"task metric dropped {drop:.4g} from {base:.4g}; at most {allowed:.4g} allowed")
            else:
                result.reasons.append(f"task metric '{self.tolerance.metric}' rose {drop:.4g} from {base:.4g} "
                                      f"(lower is better); at most {allowed:.4g} allowed")
        return result

    def allowed(self, reference: float) -> float:
        if self.tolerance.max_drop is not None:
            return self.tolerance.max_drop
        return float(self.tolerance.max_relative_drop or 0.0) * abs(reference)

    def _value(self, part: str, outputs: Outputs) -> tuple[float | None, str]:
        """The metric on ``outputs``, computed once per list; a metric that exited or did not return in time
        fails the stage (``UserCodeError``), one that raised or returned no number is a failed candidate."""
        if not outputs:
            return None, "no outputs"
        key = (part, id(outputs))
        if key not in self.values:
            value = evaluate(self.function, str(self.tolerance.metric), outputs, self.labels[part][:len(outputs)],
                             strict=True)
            self.values[key] = (outputs, value)
            while len(self.values) > REMEMBERED:
                self.values.popitem(last=False)
        self.values.move_to_end(key)
        return self.values[key][1]


def judged(reference: Outputs, outputs: Outputs, tolerance: Tolerance, judge: TaskJudge | None,
           detections: Mapping[str, Any] | None = None) -> OutputComparison:
    """``outputs`` against ``reference``: by the task metric when there is a judge (all samples its search
    part), else by ``tolerance``'s output limits (a detector's boxes matched by IoU: ``detections``)."""
    if judge is None:
        return compare_outputs(reference, outputs, tolerance, detections=detections)
    return judge.compare("search", reference, outputs)


def labels_missing(datasets: Mapping[str, DatasetInfo], resolve: Any, dataset: str | None, input_names: list[str],
                   samples: int) -> str | None:
    """Why a task-metric budget on ``dataset`` cannot run (no labels to compute the metric with); None when it
    can."""
    if dataset is None:
        return ("a task-metric tolerance needs labelled budget data, and the budget reads seeded random data: "
                "set the stage's budget data (budget.data, calibration.data) to an npy dataset whose .npz samples "
                "hold a 'label' array, or to a text dataset (reader text: its labels are the token ids)")
    labels = read_labels(datasets, resolve, dataset, input_names, samples)
    if labels is None:
        return (f"a task-metric tolerance needs labels, and the budget dataset '{dataset}' has none: give its .npz "
                "samples a 'label' (or 'labels') array beside the inputs (docs/validate.md)")
    return None


def task_for(tolerance: TaskTolerance, field: str, datasets: Mapping[str, DatasetInfo], resolve: Any,
             dataset: str | None, input_names: list[str], samples: int) -> Task:
    """The metric function and one label per sample of ``dataset``'s first ``samples``; a clear error naming
    ``field`` when the metric is unnamed or the data has no labels for every sample."""
    if tolerance.metric is None:
        raise RecipeError("names no metric, and the recipe's validate.metric is not set: name one "
                          "('metrics.py:accuracy', or a built-in one such as 'perplexity') here or in validate.metric",
                          field=field)
    why = labels_missing(datasets, resolve, dataset, input_names, samples)
    if why is not None:
        raise DataError(f"{field}: {why}")
    labels = read_labels(datasets, resolve, dataset, input_names, samples)
    assert labels is not None  # labels_missing said they are there
    if len(labels) < samples:
        raise DataError(f"{field}: the budget dataset '{dataset}' gave {samples} samples and {len(labels)} "
                        "labels; label every sample")
    return load_metric(tolerance.metric, resolve, field, tolerance.metric_timeout_seconds), labels[:samples]


def _rounded(value: float | None) -> float | None:
    return None if value is None or not math.isfinite(value) else float(f"{value:.6g}")
