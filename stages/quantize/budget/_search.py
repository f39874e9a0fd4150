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

With a task metric (``tolerance: {metric, max_drop}``, ``qdeploy.stages.task_metric``) every decision above
is the metric's drop from float32 on the same samples; the ranking stays the local error.  ``weigh_latency``
adds a second search in harm-per-second order and writes the fastest of the two that holds (``_Latency``,
``_budget_latency``).  A time bound (``max_seconds``, else a default scaled by the first full evaluation's
seconds) stops the search with the best model measured (``_budget_cost``).

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
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from qdeploy.stages.quantize.budget._cost import Clock, OutOfTime
from qdeploy.stages.quantize.budget._eval import Evaluator, Feeds, Measured, error_ratio, summary
from qdeploy.stages.quantize.budget._latency import (
    Point,
    TimingSource,
    added_seconds,
    by_harm_per_second,
    fastest,
    measure_costs,
)
from qdeploy.stages.quantize.budget._notes import confirmation, kept_records, miss_note
from qdeploy.stages.quantize.budget._rank import Ranked, rank_candidates
from qdeploy.stages.quantize.budget._targets import (
    SEARCH_TARGET,
    Combined,
    CombinedMeasured,
    TargetChecks,
    TargetPlan,
)
from qdeploy.stages.quantize.findings import BudgetFindings
from qdeploy.stages.task_metric import MetricComparison, TaskJudge

if TYPE_CHECKING:
    import onnx

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
    metric: float | None = None
    """The task metric on the search samples, when the tolerance is one."""

    def finding(self) -> dict[str, Any]:
        entry: dict[str, Any] = {"phase": self.phase, "float_nodes": self.float_nodes}
        if self.fraction is not None:
            entry.update(error_fraction=round(self.fraction, 4), search_error_ratio=self.ratio)
        if self.metric is not None:
            entry["task_metric"] = float(f"{self.metric:.6g}")
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


Task = tuple[Callable[[dict[str, Any], Any], Any], list[np.ndarray]]
"""A task metric's function and one label per budget sample."""


@dataclass
class BudgetResult:
    model: onnx.ModelProto
    kept: list[str]
    """Nodes the budget kept in float."""
    findings: BudgetFindings


class _Search:
    """The search's state: ranked candidates, measured trials, the error fraction, and what was tried."""

    def __init__(self, build: Builder, evaluate: Evaluator | Combined, ranked: list[str], fraction: float,
                 on_progress: Callable[[str], None], clock: Clock | None = None, tag: str = "") -> None:
        self.build, self.evaluate, self.ranked = build, evaluate, ranked
        self.fraction = fraction
        self.on_progress = on_progress
        self.clock = clock or Clock()
        self.tag = tag
        """Prefixes the phase names of a second search (the latency-aware one)."""
        self.measured: dict[frozenset[str], Measured | CombinedMeasured] = {}
        self.tried: list[_Trial] = []
        self.needed: set[str] = set()
        self.recorded: set[tuple[frozenset[str], float]] = set()
        """Nodes that broke the tolerance when quantized again on their own."""

    def passes(self, kept: list[str], phase: str) -> bool:
        """Whether the model with these nodes float holds the tightened tolerance on the search samples."""
        key = frozenset(kept)
        if key not in self.measured:
            self.clock.check(f"{self.tag}{phase}")
            self.on_progress(f"accuracy budget: {self.tag}{phase}, {len(kept)} node(s) kept float")
            with self.clock.phase(f"{self.tag}{phase}"):
                self.measured[key] = self.evaluate.measure(self.build(list(kept)))
        comparison = self.evaluate.on_search(self.measured[key], self.fraction)
        if (key, self.fraction) in self.recorded:
            return comparison.passed
        self.recorded.add((key, self.fraction))
        ratio = error_ratio(self.evaluate.on_search(self.measured[key]), self.evaluate.tolerance)
        metric = comparison.metric if isinstance(comparison, MetricComparison) else None
        self.tried.append(_Trial(f"{self.tag}{phase}", len(kept), comparison.passed, fraction=self.fraction,
                                 ratio=None if math.isinf(ratio) else round(ratio, 4), metric=metric))
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


def meet_budget(build: Builder, float_model: Path, feeds: list[Feeds], tolerance: Any, work_dir: Path, *,
                max_float_nodes: int | None, targets: Sequence[TargetPlan] = (),
                on_progress: Callable[[str], None] = lambda message: None, task: Task | None = None,
                max_seconds: float | None = None, timing: Sequence[TimingSource] = ()) -> BudgetResult:
    """The quantized model that holds the tolerance on held-back samples with few nodes kept in float, on every
    target in ``targets`` (see the module doc); ``build(kept)`` returns the model with those nodes kept in float.
    ``task``: (metric function, one label per sample) when ``tolerance`` is a task metric's; ``max_seconds``
    bounds the search, else the default bound (``_budget_cost``); ``timing``: the targets' per-node costs for
    latency-aware reverting."""
    import onnx

    clock = Clock(max_seconds)
    held_count = held_back_count(len(feeds))
    search_feeds, held_feeds = feeds[:len(feeds) - held_count], feeds[len(feeds) - held_count:]
    judge = TaskJudge(task[0], tolerance, task[1], len(search_feeds)) if task is not None else None
    evaluate = Evaluator(float_model, search_feeds, held_feeds, tolerance, work_dir, judge=judge)
    checks = TargetChecks(evaluate, targets, on_progress)
    clock.counter = lambda: sum(entry["evaluations"] for entry in checks.cost().values())
    full_model = build([])
    with clock.phase("fully quantized"):
        full = evaluate.measure(full_model, held=True)
    clock.bound_from(clock.phases["fully quantized"]["seconds"])  # the default bound scales with the model
    checks.remember([], full, evaluate)
    initial = _both(evaluate, full)
    opening = _Opening(tolerance.model_dump(exclude_none=True), len(feeds), len(search_feeds), held_count, initial,
                       clock)
    active: Evaluator | Combined = evaluate
    if _holds(evaluate, full):
        with clock.phase("targets"):
            missed = checks.confirm(full_model, [])
        if not missed:
            confirmed = f"{confirmation(held_count, evaluate, full)}; {checks.sentence()}"
            return BudgetResult(full_model, [], _closed(opening, checks, confirmed, met=True, kept_float=[],
                                                        final=initial))
        active = checks.search_set(missed)
    candidates = build.candidates(full_model)
    try:
        with clock.phase("ranking"):
            ranked, ranking = rank_candidates(build, evaluate, candidates, onnx.load(str(float_model)), full_model,
                                              work_dir, on_progress, check=clock.check)
    except OutOfTime:
        ranked, ranking = [], f"none: {'budget.max_seconds' if max_seconds else 'the default time bound'} passed " \
                              "during the ranking"
    limit = len(ranked) if max_float_nodes is None else min(len(ranked), max_float_nodes)
    phases: list[_Phase] = []
    tried: list[_Trial] = []
    needed: set[str] = set()
    held_before = ([], full, evaluate, {}) if active is not evaluate else None  # the last search that held
    while True:
        search = _Search(build, active, [item.name for item in ranked], 1.0, on_progress, clock)
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
            with clock.phase("confirm on held-back samples"):
                measured = active.measure(final, held=True)
        met = met and _holds(active, measured)
        checks.remember(kept, measured, active)
        with clock.phase("targets"):
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
        if not new or (not met and SEARCH_TARGET in checks.evaluators) or clock.stopped:
            break  # every miss was searched for, or the search missed on a target the variant is validated on
        active = checks.search_set(sorted(searched | set(missed)))
    front: dict[str, Any] | None = None
    if timing and met and not missed and ranked and clock.stopped is None:
        latency = _Latency(build, active, checks, clock, on_progress, held_count)
        kept, final, measured, front = latency.front(ranked, limit, float_model, full_model, full, kept, measured,
                                                     timing, feeds)
        tried += latency.tried
    met = met and checks.all_confirmed() is not False
    confirmed = f"{confirmation(held_count, active, measured)}; {checks.sentence()}"
    note = None if met else miss_note(kept, ranked, limit, phases, tried, ROUNDS, checks)  # after the sentence
    if clock.stopped:
        note = f"{clock.stopped}; {note}" if note else clock.stopped
    if note is not None:
        log.warning("quantize: accuracy budget %s: %s", "stopped" if clock.stopped else "not met", note)
    findings = _closed(opening, checks, confirmed, met=met, final=_both(active, measured),
                       candidates=len(candidates), ranking=ranking, margin=margin,
                       phases=[phase.finding() for phase in phases],
                       kept_float=kept_records(kept, ranked, candidates, needed, front),
                       requantized=sum(1 for trial in tried if trial.phase == "re-quantize" and trial.passed),
                       tried=[trial.finding() for trial in tried], note=note, front=front)
    return BudgetResult(final, sorted(kept), findings)


class _Latency:
    """The latency-aware search (``_budget_latency``): a second search in harm-per-second order, and the front of
    the fully quantized model and both searches' results; the fastest point that holds is written."""

    def __init__(self, build: Builder, active: Evaluator | Combined, checks: TargetChecks, clock: Clock,
                 on_progress: Callable[[str], None], held_count: int) -> None:
        self.build, self.active, self.checks, self.clock = build, active, checks, clock
        self.on_progress, self.held_count = on_progress, held_count
        self.tried: list[_Trial] = []

    def front(self, ranked: list[Ranked], limit: int, float_model: Path, full_model: onnx.ModelProto,
              full: Measured, kept: list[str], measured: Measured | CombinedMeasured, timing: Sequence[TimingSource],
              feeds: list[Feeds]) -> tuple[list[str], onnx.ModelProto, Measured | CombinedMeasured, dict[str, Any]]:
        names = [item.name for item in ranked]
        self.on_progress("accuracy budget: timing the candidates kept float")
        with self.clock.phase("latency: timing"):
            costs, how = measure_costs(timing, float_model, full_model, names, feeds)
        if not costs:  # no runtime could time it: the harm-ranked set stays
            return kept, self.build(kept), measured, {"timing": how, "points": [], "chosen": None}
        primary = next(iter(costs))
        search = _Search(self.build, self.active, by_harm_per_second(ranked, costs[primary]), 1.0, self.on_progress,
                         self.clock, tag="latency: ")
        full_on = search.measured[frozenset()] = _full_on(self.active, self.checks, full_model, full)
        search.fraction = _first_fraction(self.active, full_on, self.held_count)
        cheap, met, _ = _rounds(search, limit, len(names))
        for trial in search.tried:
            trial.on = self.active.label
        self.tried = search.tried
        cheap_measured = search.measured.get(frozenset(cheap))
        if cheap_measured is None or not cheap_measured.held_part:
            with self.clock.phase("latency: confirm on held-back samples"):
                cheap_measured = self.active.measure(self.build(cheap), held=True)
        points = [Point([], "fully quantized", _holds(self.active, full_on), _both(self.active, full_on),
                        added_seconds([], costs)),
                  Point(kept, "ranked by harm", True, _both(self.active, measured), added_seconds(kept, costs)),
                  Point(cheap, f"ranked by harm per second on {primary}", met and _holds(self.active, cheap_measured),
                        _both(self.active, cheap_measured), added_seconds(cheap, costs))]
        chosen, final = fastest(points[1:], primary) + 1, self.build(kept)  # the fully quantized one missed
        if chosen == 2 and set(cheap) != set(kept):
            candidate = self.build(cheap)
            self.checks.remember(cheap, cheap_measured, self.active)
            with self.clock.phase("targets"):
                missed = self.checks.confirm(candidate, cheap)
            if not missed:
                kept, final, measured = cheap, candidate, cheap_measured
            else:  # a target misses the cheaper set: the harm-ranked one, confirmed before, is written
                points[2].holds, chosen = False, 1
                self.checks.confirm(final, kept)
        front = {"timing": how, "chosen_by": primary,
                 "points": [point.finding() for point in points], "chosen": chosen}
        return kept, final, measured, front


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
    clock: Clock


def _closed(opening: _Opening, checks: TargetChecks, confirmed: str, **outcome: Any) -> BudgetFindings:
    """The findings: the opening, the search's ``outcome``, what each target says, what each runtime and each
    phase cost, and the totals."""
    runtimes = checks.cost()
    clock = opening.clock
    return BudgetFindings(tolerance=opening.tolerance, samples=opening.samples, search_samples=opening.search_samples,
                          held_back_samples=opening.held_back_samples, initial=opening.initial, **outcome,
                          targets=checks.verdicts(), runtimes=runtimes,
                          evaluations=sum(entry["evaluations"] for entry in runtimes.values()),
                          evaluation_seconds=round(sum(entry["seconds"] for entry in runtimes.values()), 3),
                          seconds=round(clock.elapsed(), 3), confirmed=confirmed, cost=clock.report(),
                          stopped=clock.stopped, max_seconds=clock.max_seconds, time_bound=clock.time_bound())


def _rounds(search: _Search, limit: int, candidates: int) -> tuple[list[str], bool, dict[str, Any]]:
    """Search, prune and confirm, tightening the error fraction after a held-back miss; (kept, met, margin)."""
    margin: dict[str, Any] = {"first_error_fraction": round(search.fraction, 4)}
    best: list[str] | None = None
    failing = 0  # a prefix failing at one fraction fails at every smaller one: later rounds start above it
    try:
        for round_number in range(1, ROUNDS + 1):
            margin.update(error_fraction=round(search.fraction, 4), rounds=round_number)
            failing, count = search.shortest_prefix(failing, limit)
            if count is None:
                break
            best = search.prune(search.ranked[:count], prune_evaluations(candidates))
            phase = f"{search.tag}confirm on held-back samples"
            search.clock.check(phase)
            with search.clock.phase(phase):
                measured = search.evaluate.measure(search.build(best), held=True)
            search.measured[frozenset(best)] = measured
            held = search.evaluate.on_held(measured) if measured.held_part else None
            search.tried.append(_Trial(phase, len(best), held.passed if held else None))
            if held is None or held.passed:
                return best, search.evaluate.on_search(measured, search.fraction).passed, margin
            gap = error_ratio(held, search.evaluate.tolerance) / max(search.ratio(best), 1e-12)
            search.fraction *= min(0.7, 0.9 / gap) if math.isfinite(gap) else 0.5
    except OutOfTime:  # the best measured so far: the fewest nodes that held on the search samples, else the closest
        best = None
    if best is None:  # nothing passed on the search samples: the trial closest to the tolerance
        order = {name: index for index, name in enumerate(search.ranked)}
        stopped = search.clock.stopped is not None
        best = min((sorted(k, key=order.__getitem__) for k in search.measured),
                   key=lambda kept: (max(search.ratio(kept), 1.0), len(kept)) if stopped
                   else (search.ratio(kept), len(kept)))
        return best, stopped and search.ratio(best) <= 1.0, margin  # stopped: the held-back check follows
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
