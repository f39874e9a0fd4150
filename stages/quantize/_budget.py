"""The accuracy budget: keep quantized nodes in float, most harmful first, until the tolerance holds on samples
the search has not seen.

1. The budget samples are split: about a quarter is held back, the search
   runs on the rest.  If the fully quantized model holds the tolerance on all
   of them, nothing more is done.
2. Every candidate (a quantized node that rounds: not Reshape, Transpose...)
   is ranked by the error it adds: one run of the float and the fully
   quantized model with every candidate's inputs and outputs exposed
   (``quantize_budget_eval.rank_by_added_error``).
3. Nodes are reverted to float cumulatively in ranked order: the shortest
   prefix of the ranking that holds the tolerance on the search samples is
   found by doubling, then bisection.  When the error is the sum of many
   layers, no single node fixes it; a prefix does.
4. Nodes of that prefix that turn out not to matter are quantized again
   (groups of the least harmful first, halved when a group does not hold).
5. The result is confirmed on the held-back samples with the real tolerance.
   The search itself holds candidates to a tightened tolerance (a fraction
   of each allowed error, from the spread of the per-sample errors); when the
   held-back samples still miss, the fraction shrinks by the gap measured
   between search and held-back samples and the search goes on from where
   it stood (at most ``ROUNDS`` rounds).

6. The result is run on every target the variant is validated on
   (``targets``, ``_budget_targets``): each says confirmed, missed or
   unavailable.  When one misses, the search (steps 3-5, same ranking) runs
   again with every trial measured on the targets that missed and on ort:cpu
   when it is one of them, until the tolerance holds there or no kept set
   does (then the model of the last search that held is written, marked
   failing on that target).

When even every candidate kept float misses (or ``max_float_nodes`` stops the
search), the best model found is returned and marked as failing its budget,
with every trial in ``tried``.

Cost: one ranking run, at most ``2*log2(n)+2`` evaluations per round for the
prefix, at most ``PRUNE_EVALUATIONS(n)`` (also ``O(log n)``) for the pruning,
one confirmation per round: ``O(log n)`` evaluations for ``n`` candidates,
each one model build and one ONNX Runtime session on the search samples
(``O(model size)``), so ``O(n log n)`` in all.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from qdeploy.stages.quantize._budget_eval import Evaluator, Feeds, Measured, error_ratio, summary
from qdeploy.stages.quantize._budget_rank import Ranked, rank_candidates
from qdeploy.stages.quantize._budget_targets import (
    MISSED,
    SEARCH_TARGET,
    Combined,
    CombinedMeasured,
    TargetChecks,
    TargetPlan,
)
from qdeploy.stages.quantize.findings import BudgetFindings, TargetRecord

if TYPE_CHECKING:
    import onnx

    from qdeploy.core.tolerance import Tolerance

log = logging.getLogger(__name__)

ROUNDS = 3
"""Search rounds, each with a smaller error fraction, before a held-back miss is final."""
MIN_FRACTION, MAX_FRACTION = 0.5, 0.95
"""Bounds of the first round's error fraction (a 5% to 50% margin)."""


def held_back_count(samples: int) -> int:
    """Budget samples held back from the search: a quarter, at least one when there are two or more."""
    return 0 if samples < 2 else max(1, samples // 4)


def prune_evaluations(candidates: int) -> int:
    """Evaluations the pruning may spend: grows like log2 of the candidate count."""
    return 2 * math.ceil(math.log2(candidates + 1)) + 4


class Builder(Protocol):
    """Builds the quantized model with some nodes kept float, and names the nodes it could keep float."""

    def __call__(self, kept: list[str]) -> onnx.ModelProto: ...

    def candidates(self, quantized: onnx.ModelProto) -> dict[str, str]: ...


@dataclass
class _Trial:
    """One model the search measured: what the report's ``tried`` lists, kept typed for the search's own use."""

    phase: str
    float_nodes: int
    passed: bool | None
    fraction: float | None = None
    """The error fraction the search held it to; None for a confirmation on the held-back samples."""
    ratio: float | None = None
    on: str = ""

    def finding(self) -> dict[str, Any]:
        entry: dict[str, Any] = {"phase": self.phase, "float_nodes": self.float_nodes}
        if self.fraction is not None:
            entry.update(error_fraction=round(self.fraction, 4), search_error_ratio=self.ratio)
        return {**entry, "passed": self.passed, "on": self.on}


@dataclass
class _Phase:
    """One search, on one set of runtimes: where it searched, whether it held there, what it kept and missed."""

    searched_on: str
    met_there: bool
    kept_float: int
    margin: dict[str, Any]
    missed_on: list[str]
    written: str | None = None

    def finding(self) -> dict[str, Any]:
        entry = {"searched_on": self.searched_on, "met_there": self.met_there, "kept_float": self.kept_float,
                 "margin": self.margin, "missed_on": self.missed_on}
        return {**entry, "written": self.written} if self.written is not None else entry


@dataclass
class BudgetResult:
    model: onnx.ModelProto
    kept: list[str]
    """Nodes the budget kept in float."""
    findings: BudgetFindings


class _Search:
    """The search's state: ranked candidates, measured trials, the error fraction, and what was tried."""

    def __init__(self, build: Builder, evaluate: Evaluator | Combined, ranked: list[str], fraction: float,
                 on_progress: Callable[[str], None]) -> None:
        self.build, self.evaluate, self.ranked = build, evaluate, ranked
        self.fraction = fraction
        self.on_progress = on_progress
        self.measured: dict[frozenset[str], Measured | CombinedMeasured] = {}
        self.tried: list[_Trial] = []
        self.needed: set[str] = set()
        self.recorded: set[tuple[frozenset[str], float]] = set()
        """Nodes that broke the tolerance when quantized again on their own."""

    def passes(self, kept: list[str], phase: str) -> bool:
        """Whether the model with these nodes float holds the tightened tolerance on the search samples."""
        key = frozenset(kept)
        if key not in self.measured:
            self.on_progress(f"accuracy budget: {phase}, {len(kept)} node(s) kept float")
            self.measured[key] = self.evaluate.measure(self.build(list(kept)))
        comparison = self.evaluate.on_search(self.measured[key], self.fraction)
        if (key, self.fraction) in self.recorded:
            return comparison.passed
        self.recorded.add((key, self.fraction))
        ratio = error_ratio(self.evaluate.on_search(self.measured[key]), self.evaluate.tolerance)
        self.tried.append(_Trial(phase, len(kept), comparison.passed, fraction=self.fraction,
                                 ratio=None if math.isinf(ratio) else round(ratio, 4)))
        return comparison.passed

    def shortest_prefix(self, failing: int, limit: int) -> tuple[int, int | None]:
        """(the longest prefix known to fail, the shortest that passes or None): galloping up from ``failing``
        (1, 2, 4... nodes more), then bisection."""
        passing, step = None, 1
        while passing is None and failing + step < limit:
            if self.passes(self.ranked[:failing + step], "prefix"):
                passing = failing + step
            else:
                failing, step = failing + step, 2 * step
        if passing is None:
            if limit <= failing or not self.passes(self.ranked[:limit], "prefix"):
                return failing, None
            passing = limit
        while passing - failing > 1:
            middle = (failing + passing) // 2
            if self.passes(self.ranked[:middle], "prefix"):
                passing = middle
            else:
                failing = middle
        return failing, passing

    def prune(self, kept: list[str], allowance: int) -> list[str]:
        """Quantize again the kept nodes that do not matter: groups of the least harmful first, halved when a
        group does not hold (at most ``allowance`` evaluations).  A node alone in a group that does not hold
        is needed."""
        groups = [kept[len(kept) // 2:], kept[:len(kept) // 2]]
        spent = 0
        while groups and spent < allowance:
            group = groups.pop(0)
            if not group:
                continue
            members = set(group)
            trial = [name for name in kept if name not in members]
            spent += frozenset(trial) not in self.measured
            if self.passes(trial, "re-quantize"):
                kept = trial
            elif len(group) > 1:
                groups[:0] = [group[len(group) // 2:], group[:len(group) // 2]]
            else:
                self.needed.add(group[0])
        return kept

    def ratio(self, kept: list[str]) -> float:
        return error_ratio(self.evaluate.on_search(self.measured[frozenset(kept)]), self.evaluate.tolerance)


def meet_budget(build: Builder, float_model: Path, feeds: list[Feeds], tolerance: Tolerance, work_dir: Path, *,
                max_float_nodes: int | None, targets: Sequence[TargetPlan] = (),
                on_progress: Callable[[str], None] = lambda message: None) -> BudgetResult:
    """The quantized model that holds the tolerance on held-back samples with few nodes kept in float, on every
    target in ``targets`` (see the module doc); ``build(kept)`` returns the model with those nodes kept in float."""
    import onnx

    started = time.perf_counter()
    held_count = held_back_count(len(feeds))
    search_feeds, held_feeds = feeds[:len(feeds) - held_count], feeds[len(feeds) - held_count:]
    evaluate = Evaluator(float_model, search_feeds, held_feeds, tolerance, work_dir)
    checks = TargetChecks(evaluate, targets, on_progress)
    full_model = build([])
    full = evaluate.measure(full_model, held=True)
    checks.remember([], full, evaluate)
    initial = _both(evaluate, full)
    opening = _Opening(tolerance.model_dump(exclude_none=True), len(feeds), len(search_feeds), held_count, initial)
    active: Evaluator | Combined = evaluate
    if _holds(evaluate, full):
        missed = checks.confirm(full_model, [])
        if not missed:
            confirmed = f"{_confirmation(held_count, evaluate, full)}; {checks.sentence()}"
            return BudgetResult(full_model, [], _closed(opening, checks, confirmed, started, met=True, kept_float=[],
                                                        final=initial))
        active = checks.search_set(missed)
    candidates = build.candidates(full_model)
    ranked, ranking = rank_candidates(build, evaluate, candidates, onnx.load(str(float_model)), full_model,
                                      work_dir, on_progress)
    limit = len(ranked) if max_float_nodes is None else min(len(ranked), max_float_nodes)
    phases: list[_Phase] = []
    tried: list[_Trial] = []
    needed: set[str] = set()
    held_before = ([], full, evaluate, {}) if active is not evaluate else None  # the last search that held
    while True:
        search = _Search(build, active, [item.name for item in ranked], 1.0, on_progress)
        search.measured[frozenset()] = _full_on(active, checks, full_model, full)
        search.fraction = _first_fraction(active, search.measured[frozenset()], held_count)
        kept, met, margin = _rounds(search, limit, len(candidates))
        for trial in search.tried:
            trial.on = active.label
        tried += search.tried
        needed |= search.needed
        final = build(kept)
        measured = search.measured.get(frozenset(kept))
        if measured is None or not measured.held_part:
            measured = active.measure(final, held=True)
        checks.remember(kept, measured, active)
        missed = checks.confirm(final, kept)
        phases.append(_Phase(active.label, met, len(kept), margin, missed))
        searched = set(active.evaluators) if isinstance(active, Combined) else set()
        if not met and held_before is not None:
            # no kept set holds on the target that missed: keeping more float there buys nothing; write the
            # model that holds where it held, marked failing on that target
            kept, measured, active, margin = held_before
            final = build(kept)
            missed = checks.confirm(final, kept)
            phases[-1].written = f"the model of the search on {active.label}, which held there"
            break
        if met:
            held_before = (kept, measured, active, margin)
        new = [name for name in missed if name not in searched]
        if not new or (not met and SEARCH_TARGET in checks.evaluators):
            break  # every miss was searched for, or the search missed on a target the variant is validated on
        active = checks.search_set(sorted(searched | set(missed)))
    met = met and checks.all_confirmed() is not False
    confirmed = f"{_confirmation(held_count, active, measured)}; {checks.sentence()}"
    note = None if met else _miss_note(kept, ranked, limit, phases, tried, checks)  # after the sentence: as before
    if note is not None:
        log.warning("quantize: accuracy budget not met: %s", note)
    findings = _closed(opening, checks, confirmed, started, met=met, final=_both(active, measured),
                       candidates=len(candidates), ranking=ranking, margin=margin,
                       phases=[phase.finding() for phase in phases],
                       kept_float=_kept_records(kept, ranked, candidates, needed),
                       requantized=sum(1 for trial in tried if trial.phase == "re-quantize" and trial.passed),
                       tried=[trial.finding() for trial in tried], note=note)
    return BudgetResult(final, sorted(kept), findings)


def _full_on(active: Evaluator | Combined, checks: TargetChecks, full_model: onnx.ModelProto,
             full: Measured) -> Measured | CombinedMeasured:
    """The fully quantized model measured on the search's runtimes, from what was measured already."""
    if not isinstance(active, Combined):
        return full
    return CombinedMeasured({name: checks.measured(name, full_model, []) for name in active.evaluators})


@dataclass(frozen=True)
class _Opening:
    """What the budget's findings say before any search: the tolerance, the samples, the full model's errors."""

    tolerance: dict[str, Any]
    samples: int
    search_samples: int
    held_back_samples: int
    initial: dict[str, Any]


def _closed(opening: _Opening, checks: TargetChecks, confirmed: str, started: float,
            **outcome: Any) -> BudgetFindings:
    """The findings: the opening, the search's ``outcome``, what each target says, what each runtime cost, and the
    totals."""
    runtimes = checks.cost()
    return BudgetFindings(tolerance=opening.tolerance, samples=opening.samples, search_samples=opening.search_samples,
                          held_back_samples=opening.held_back_samples, initial=opening.initial, **outcome,
                          targets=checks.verdicts(), runtimes=runtimes,
                          evaluations=sum(entry["evaluations"] for entry in runtimes.values()),
                          evaluation_seconds=round(sum(entry["seconds"] for entry in runtimes.values()), 3),
                          seconds=round(time.perf_counter() - started, 3), confirmed=confirmed)


def _kept_records(kept: list[str], ranked: list[Ranked], candidates: dict[str, str],
                  needed: set[str]) -> list[dict[str, Any]]:
    rank = {item.name: (index, item) for index, item in enumerate(ranked, 1)}
    records = []
    for name in kept:
        position, item = rank[name]
        why = f"ranked {position} of {len(ranked)} by the error it adds; in the shortest ranked prefix that holds " \
              "the tolerance"
        if name in needed:
            why += "; quantizing it again on its own broke the tolerance"
        record = {"node": name, "op_type": candidates[name], "rank": position,
                  "added_noise_to_signal": _rounded(item.local), "reason": why}
        if item.alone is not None:
            record["error_ratio_rise_quantized_alone"] = _rounded(item.alone)
        records.append(record)
    return records


def _rounds(search: _Search, limit: int, candidates: int) -> tuple[list[str], bool, dict[str, Any]]:
    """Search, prune and confirm, tightening the error fraction after a held-back miss; (kept, met, margin)."""
    margin: dict[str, Any] = {"first_error_fraction": round(search.fraction, 4)}
    best: list[str] | None = None
    failing = 0  # a prefix failing at one fraction fails at every smaller one: later rounds start above it
    for round_number in range(1, ROUNDS + 1):
        margin.update(error_fraction=round(search.fraction, 4), rounds=round_number)
        failing, count = search.shortest_prefix(failing, limit)
        if count is None:
            break
        best = search.prune(search.ranked[:count], prune_evaluations(candidates))
        measured = search.evaluate.measure(search.build(best), held=True)
        search.measured[frozenset(best)] = measured
        held = search.evaluate.on_held(measured) if measured.held_part else None
        search.tried.append(_Trial("confirm on held-back samples", len(best), held.passed if held else None))
        if held is None or held.passed:
            return best, search.evaluate.on_search(measured, search.fraction).passed, margin
        gap = error_ratio(held, search.evaluate.tolerance) / max(search.ratio(best), 1e-12)
        search.fraction *= min(0.7, 0.9 / gap) if math.isfinite(gap) else 0.5
    if best is None:  # nothing passed on the search samples: the trial closest to the tolerance
        order = {name: index for index, name in enumerate(search.ranked)}
        best = min((sorted(k, key=order.__getitem__) for k in search.measured),
                   key=lambda kept: (search.ratio(kept), len(kept)))
    return best, False, margin


def _first_fraction(evaluate: Evaluator | Combined, full: Measured | CombinedMeasured, held_count: int) -> float:
    """The first round's error fraction: a margin of two standard errors of the held-back samples' mean error,
    from the spread of the per-sample errors of the fully quantized model on the search samples."""
    ratios = np.array([r for r in evaluate.per_sample_ratios(full) if math.isfinite(r)])
    if len(ratios) < 2 or ratios.mean() <= 0:
        return MAX_FRACTION
    spread = float(ratios.std(ddof=1) / ratios.mean())
    return float(np.clip(1.0 / (1.0 + 2.0 * spread / math.sqrt(max(held_count, 1))), MIN_FRACTION, MAX_FRACTION))


def _holds(evaluate: Evaluator | Combined, measured: Measured | CombinedMeasured) -> bool:
    """Whether the model holds the tolerance on the search samples and, when measured there, the held-back ones."""
    return evaluate.on_search(measured).passed and (not measured.held_part or evaluate.on_held(measured).passed)


def _both(evaluate: Evaluator | Combined, measured: Measured | CombinedMeasured) -> dict[str, Any]:
    both = {"search": summary(evaluate.on_search(measured), evaluate.tolerance)}
    if measured.held_part:
        both["held_back"] = summary(evaluate.on_held(measured), evaluate.tolerance)
    return both


def _confirmation(held_count: int, evaluate: Evaluator | Combined, measured: Measured | CombinedMeasured) -> str:
    if held_count == 0:
        return "unchecked: a single budget sample, none could be held back; give budget.samples >= 2"
    held = evaluate.on_held(measured)
    return (f"the tolerance {'holds' if held.passed else 'misses'} on {held_count} held-back sample(s) "
            f"(worst cosine {held.worst().get('cosine'):.4g})")


def _miss_note(kept: list[str], ranked: list[Ranked], limit: int, phases: list[_Phase], tried: list[_Trial],
               checks: TargetChecks) -> str:
    last = phases[-1].searched_on
    everything = any(trial.float_nodes == len(ranked) and trial.phase == "prefix" and not trial.passed
                     and trial.on == last for trial in tried)
    if limit < len(ranked):
        reason = f"max_float_nodes ({limit}) was reached"
    elif everything:
        reason = ("even with every candidate kept float the tolerance misses: the error comes from what is not a "
                  "candidate (data movement, the float parts' numerics on that runtime); see 'tried'")
    else:
        reason = f"no ranked prefix held it after {phases[-1].margin.get('rounds', ROUNDS)} round(s) (see 'tried')"
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
