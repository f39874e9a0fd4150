"""What the accuracy budget's findings say: why each node is kept float, the held-back verdict, why the budget
missed, and the typed findings themselves (``closed``)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypedDict

from qdeploy.stages.accuracy_budget.findings import (
    BudgetComparison,
    BudgetFindings,
    BudgetLimits,
    FrontRecord,
    KeptFloat,
    PhaseRecord,
    TrialRecord,
)
from qdeploy.stages.accuracy_budget.targets import MISSED
from qdeploy.stages.task_metric import MetricComparison

if TYPE_CHECKING:
    from qdeploy.stages.accuracy_budget.clock import Clock
    from qdeploy.stages.accuracy_budget.evaluate import Evaluator, Measured
    from qdeploy.stages.accuracy_budget.findings import TargetRecord
    from qdeploy.stages.accuracy_budget.rank import Ranked
    from qdeploy.stages.accuracy_budget.targets import Combined, CombinedMeasured, TargetChecks


__all__ = ["Opening", "Trial", "closed", "confirmation", "kept_records", "miss_note"]


class _TrialErrors(TypedDict, total=False):
    """A trial's measured fields that ``TrialRecord`` leaves out when they were not measured."""

    error_fraction: float
    search_error_ratio: float | None
    task_metric: float


@dataclass
class Trial:
    """One model the search measured: what the report's ``tried`` lists, kept typed for the search's own use."""

    phase: str
    float_nodes: int
    passed: bool | None
    fraction: float | None = None
    """The error fraction the search held it to; None for a confirmation on the held-back samples."""
    ratio: float | None = None
    on: str = ""
    metric: float | None = None
    """The task metric on the search samples, when the tolerance is one."""

    def finding(self) -> TrialRecord:
        entry: _TrialErrors = {}
        if self.fraction is not None:
            entry.update(error_fraction=round(self.fraction, 4), search_error_ratio=self.ratio)
        if self.metric is not None:
            entry["task_metric"] = float(f"{self.metric:.6g}")
        return TrialRecord(phase=self.phase, float_nodes=self.float_nodes, **entry, passed=self.passed, on=self.on)


def kept_records(kept: list[str], ranked: list[Ranked], candidates: dict[str, str], needed: set[str],
                 front: FrontRecord | None = None) -> list[KeptFloat]:
    """Per node kept float: its rank and why; ``front``: the latency-aware search chose the set."""
    rank = {item.name: (index, item) for index, item in enumerate(ranked, 1)}
    cheaper = front is not None and front.chosen == 2
    by = front.chosen_by if front is not None else None
    records = []
    for name in kept:
        position, item = rank[name]
        why = f"ranked {position} of {len(ranked)} by the error it adds; in the shortest ranked prefix that holds " \
              "the tolerance"
        if cheaper:
            why = (f"ranked {position} of {len(ranked)} by the error it adds; in the shortest prefix of the "
                   f"harm-per-second order that holds the tolerance (latency-aware, on {by})")
        if name in needed and not cheaper:
            why += "; quantizing it again on its own broke the tolerance"
        alone = {"error_ratio_rise_quantized_alone": _rounded(item.alone)} if item.alone is not None else {}
        records.append(KeptFloat(node=name, op_type=candidates[name], rank=position,
                                 added_noise_to_signal=_rounded(item.local), reason=why, **alone))
    return records


def confirmation(held_count: int, evaluate: Evaluator | Combined, measured: Measured | CombinedMeasured) -> str:
    if held_count == 0:
        return "unchecked: a single budget sample, none could be held back; give budget.samples >= 2"
    held = evaluate.on_held(measured)
    verdict = f"the tolerance {'holds' if held.passed else 'misses'} on {held_count} held-back sample(s)"
    if isinstance(held, MetricComparison):
        drop = "not computed" if held.drop is None else f"{held.drop:.4g} of {held.allowed:.4g} allowed"
        return f"{verdict} (task metric drop {drop})"
    worst = held.worst()
    if worst.get("cosine") is None and worst.get("detections_matched") is not None:
        return f"{verdict} (detections matched {worst['detections_matched']:.1%})"
    return f"{verdict} (worst cosine {worst['cosine']:.4g})" if worst.get("cosine") is not None else verdict


def miss_note(kept: list[str], ranked: list[Ranked], limit: int, phases: list[PhaseRecord], tried: list[Any],
              rounds: int, checks: TargetChecks) -> str:
    last = phases[-1].searched_on
    everything = any(trial.float_nodes == len(ranked) and trial.phase == "prefix" and not trial.passed
                     and trial.on == last for trial in tried)
    if limit < len(ranked):
        reason = f"max_float_nodes ({limit}) was reached"
    elif everything:
        reason = ("even with every candidate kept float the tolerance misses: the error comes from what is not a "
                  "candidate (data movement, the float parts' numerics on that runtime); see 'tried'")
    else:
        reason = f"no ranked prefix held it after {phases[-1].margin.rounds or rounds} round(s) (see 'tried')"
    missed = {name: record for name, record in checks.records.items() if record.status == MISSED}
    if missed and phases[-1].met_there is False:
        reason += f", searching with the measurements of {last}"
    for record in missed.values():
        if "reason" not in record.model_fields_set:  # a runtime's own failure stays the reason
            record.reason = reason
    where = f" (misses on {', '.join(f'{name}{_ran(record)}' for name, record in missed.items())})" if missed else ""
    written = phases[-1].written or "the best model found"
    return (f"budget not met{where} with {len(kept)} of the {len(ranked)} candidates kept float: {reason}; {written} "
            "is written and marked as failing its budget")


def _ran(record: TargetRecord) -> str:
    return f", which ran {record.precision}" if record.precision else ""


def _rounded(value: float) -> float | None:
    return None if not math.isfinite(value) else float(f"{value:.4g}")


@dataclass(frozen=True)
class Opening:
    """What the budget's findings say before any search: the tolerance, the samples, the full model's errors."""

    tolerance: BudgetLimits
    samples: int
    search_samples: int
    held_back_samples: int
    initial: BudgetComparison
    clock: Clock


def closed(opening: Opening, checks: TargetChecks, confirmed: str, **outcome: Any) -> BudgetFindings:
    """The findings: the opening, the search's ``outcome``, what each target says, what each runtime and each
    phase cost, and the totals."""
    runtimes = checks.cost()
    clock = opening.clock
    return BudgetFindings(tolerance=opening.tolerance, samples=opening.samples, search_samples=opening.search_samples,
                          held_back_samples=opening.held_back_samples, initial=opening.initial, **outcome,
                          targets=checks.verdicts(), runtimes=runtimes,
                          evaluations=sum(entry.evaluations for entry in runtimes.values()),
                          evaluation_seconds=round(sum(entry.seconds for entry in runtimes.values()), 3),
                          seconds=round(clock.elapsed(), 3), confirmed=confirmed, cost=clock.report(),
                          stopped=clock.stopped, max_seconds=clock.max_seconds, time_bound=clock.time_bound())
