"""The accuracy budget: keep candidate nodes in float, most harmful first, until the tolerance holds on samples
the search has not seen.

One engine for every stage that trades precision for accuracy (int8: ``qdeploy.stages.quantize.budget``; fp16
confirms its emulated search with ``targets`` and ``prefix``).  A stage supplies only a ``Builder`` (the model with
a set of nodes kept float, and its candidates) and its ranking signal (the error each candidate adds by itself);
the engine ranks, evaluates (output tolerance or task metric, ``evaluate``), searches, checks the held-back
samples, confirms on every target with the one pinned-precision fallback (``targets``, ``precision``) and returns
a typed ``BudgetResult``.  The steps (int8's words):

1. The budget samples are split: about a quarter is held back, the search
   runs on the rest.  If the fully quantized model holds the tolerance on all
   of them, nothing more is done.
2. Every candidate (a quantized node that rounds: not Reshape, Transpose...)
   is ranked by the error it adds: one run of the float and the fully
   quantized model with every candidate's inputs and outputs exposed
   (the stage's ranking signal, ``rank``).
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
   (``targets``): each says confirmed, missed or
   unavailable.  When one misses, the search (steps 3-5, same ranking) runs
   again with every trial measured on the targets that missed and on ort:cpu
   when it is one of them, until the tolerance holds there or no kept set
   does (then the model of the last search that held is written, marked
   failing on that target).

With a task metric (``tolerance: {metric, max_drop}``, ``qdeploy.stages.task_metric``) every decision above
is the metric's drop from float32 on the same samples; the ranking stays the local error.  ``weigh_latency``
adds a second search in harm-per-second order and writes the fastest of the two that holds (``_Latency``,
``latency``).  A time bound (``max_seconds``, else a default scaled by the first full evaluation's
seconds) stops the search with the best model measured (``clock``).

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
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from qdeploy.stages.accuracy_budget.clock import Clock, OutOfTime
from qdeploy.stages.accuracy_budget.evaluate import Evaluator, Feeds, Measured, error_ratio, summary
from qdeploy.stages.accuracy_budget.findings import BudgetComparison, BudgetFindings, FrontRecord, Margin, PhaseRecord
from qdeploy.stages.accuracy_budget.latency import (
    Point,
    TimingSource,
    added_seconds,
    by_harm_per_second,
    fastest,
    measure_costs,
)
from qdeploy.stages.accuracy_budget.notes import (
    Opening,
    Trial,
    closed,
    confirmation,
    kept_records,
    miss_note,
)
from qdeploy.stages.accuracy_budget.prefix import shortest_prefix
from qdeploy.stages.accuracy_budget.rank import Ranked, rank_candidates
from qdeploy.stages.accuracy_budget.targets import (
    SEARCH_TARGET,
    Combined,
    CombinedMeasured,
    TargetChecks,
    TargetPlan,
)
from qdeploy.stages.task_metric import MetricComparison, Task, TaskJudge

if TYPE_CHECKING:
    import onnx

__all__ = ["ROUNDS", "BudgetResult", "Builder", "Signal", "held_back_count", "meet_budget", "prune_evaluations"]

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
    """What a stage supplies: its model with some nodes kept float, and the nodes it could keep float (name ->
    op type) in the fully reduced model."""

    def __call__(self, kept: list[str]) -> onnx.ModelProto: ...

    def candidates(self, quantized: onnx.ModelProto) -> dict[str, str]: ...


Signal = Callable[["onnx.ModelProto", dict[str, str], list[Feeds]], dict[str, float]]
"""The stage's ranking signal: (fully reduced model, candidates, samples) -> the error each candidate adds by
itself (int8: ``qdeploy.stages.quantize.budget``'s float copies of the quantized nodes)."""


@dataclass
class BudgetResult:
    """What the budget writes: the model, the nodes it kept float, and its typed findings."""

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
        self.tried: list[Trial] = []
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
        self.tried.append(Trial(f"{self.tag}{phase}", len(kept), comparison.passed, fraction=self.fraction,
                                 ratio=None if math.isinf(ratio) else round(ratio, 4), metric=metric))
        return comparison.passed

    def shortest_prefix(self, failing: int, limit: int) -> tuple[int, int | None]:
        """(the longest prefix known to fail, the shortest that passes or None): ``prefix.shortest_prefix``."""
        return shortest_prefix(lambda count: self.passes(self.ranked[:count], "prefix"), failing, limit)

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


def meet_budget(build: Builder, signal: Signal, float_model: Path, feeds: list[Feeds], tolerance: Any,
                work_dir: Path, *, max_float_nodes: int | None, targets: Sequence[TargetPlan] = (),
                on_progress: Callable[[str], None] = lambda message: None, task: Task | None = None,
                max_seconds: float | None = None, timing: Sequence[TimingSource] = (),
                detections: Mapping[str, Any] | None = None) -> BudgetResult:
    """The reduced model that holds the tolerance on held-back samples with few nodes kept in float, on every
    target in ``targets`` (see the module doc); ``build(kept)`` returns the model with those nodes kept in float,
    ``signal`` ranks its candidates.
    ``task``: (metric function, one label per sample) when ``tolerance`` is a task metric's; ``max_seconds``
    bounds the search, else the default bound (``clock``); ``timing``: the targets' per-node costs for
    latency-aware reverting; ``detections``: a detector's outputs, matched by IoU as validation matches them."""
    clock = Clock(max_seconds)
    held_count = held_back_count(len(feeds))
    search_feeds, held_feeds = feeds[:len(feeds) - held_count], feeds[len(feeds) - held_count:]
    judge = TaskJudge(task[0], tolerance, task[1], len(search_feeds)) if task is not None else None
    evaluate = Evaluator(float_model, search_feeds, held_feeds, tolerance, work_dir, judge=judge,
                         detections=detections)
    checks = TargetChecks(evaluate, targets, on_progress)
    clock.counter = lambda: sum(entry.evaluations for entry in checks.cost().values())
    full_model = build([])
    with clock.phase("fully quantized"):
        full = evaluate.measure(full_model, held=True)
    clock.bound_from(clock.phases["fully quantized"]["seconds"])  # the default bound scales with the model
    checks.remember([], full, evaluate)
    opening = Opening(tolerance.model_dump(exclude_none=True), len(feeds), len(search_feeds), held_count,
                      _both(evaluate, full), clock)
    active: Evaluator | Combined = evaluate
    if _holds(evaluate, full):
        with clock.phase("targets"):
            missed = checks.confirm(full_model, [])
        if not missed:
            confirmed = f"{confirmation(held_count, evaluate, full)}; {checks.sentence()}"
            return BudgetResult(full_model, [], closed(opening, checks, confirmed, met=True, kept_float=[],
                                                       final=opening.initial))
        active = checks.search_set(missed)
    candidates = build.candidates(full_model)
    ranked, ranking = _ranked(build, evaluate, candidates, lambda samples: signal(full_model, candidates, samples),
                              clock, on_progress)
    limit = len(ranked) if max_float_nodes is None else min(len(ranked), max_float_nodes)
    loop = _TargetLoop(build, checks, clock, on_progress, held_count, full_model, full)
    done = loop.run(active, [item.name for item in ranked], limit, len(candidates))
    front: FrontRecord | None = None
    if timing and done.met and not done.missed and ranked and clock.stopped is None:
        latency = _Latency(build, done.active, checks, clock, on_progress, held_count)
        done.kept, done.final, done.measured, front = latency.front(ranked, limit, float_model, full_model, full,
                                                                    done.kept, done.measured, timing, feeds)
        loop.tried += latency.tried
    met = done.met and checks.all_confirmed() is not False
    confirmed = f"{confirmation(held_count, done.active, done.measured)}; {checks.sentence()}"
    note = None if met else miss_note(done.kept, ranked, limit, loop.phases, loop.tried, ROUNDS, checks)
    if clock.stopped:
        note = f"{clock.stopped}; {note}" if note else clock.stopped
    if note is not None:
        log.warning("accuracy budget %s: %s", "stopped" if clock.stopped else "not met", note)
    findings = closed(opening, checks, confirmed, met=met, final=_both(done.active, done.measured),
                      candidates=len(candidates), ranking=ranking, margin=done.margin,
                      phases=list(loop.phases),
                      kept_float=kept_records(done.kept, ranked, candidates, loop.needed, front),
                      requantized=sum(1 for trial in loop.tried if trial.phase == "re-quantize" and trial.passed),
                      tried=[trial.finding() for trial in loop.tried], note=note, front=front)
    return BudgetResult(done.final, sorted(done.kept), findings)


def _ranked(build: Builder, evaluate: Evaluator, candidates: dict[str, str], local: Callable[[list[Feeds]], Any],
            clock: Clock, on_progress: Callable[[str], None]) -> tuple[list[Ranked], str]:
    """The candidates ranked (``rank``), or none when the time bound passes during the ranking."""
    try:
        with clock.phase("ranking"):
            return rank_candidates(build, evaluate, candidates, local, on_progress, check=clock.check,
                                   seconds_left=clock.seconds_left)
    except OutOfTime:
        bound = "budget.max_seconds" if clock.max_seconds else "the default time bound"
        return [], f"none: {bound} passed during the ranking"


@dataclass
class _Done:
    """Where the searches ended: the kept set, its model and measurement, on which runtimes, and the verdicts."""

    kept: list[str]
    final: onnx.ModelProto
    measured: Measured | CombinedMeasured
    active: Evaluator | Combined
    met: bool
    missed: list[str]
    margin: Margin


@dataclass
class _TargetLoop:
    """The search (steps 3-5), then each target's confirmation; a target that misses joins the next search."""

    build: Builder
    checks: TargetChecks
    clock: Clock
    on_progress: Callable[[str], None]
    held_count: int
    full_model: onnx.ModelProto
    full: Measured
    phases: list[PhaseRecord] = field(default_factory=list)
    tried: list[Trial] = field(default_factory=list)
    needed: set[str] = field(default_factory=set)

    def run(self, active: Evaluator | Combined, ranked: list[str], limit: int, candidates: int) -> _Done:
        checks, clock = self.checks, self.clock
        held_before = None if active is checks.search else _Done([], self.full_model, self.full, checks.search,
                                                                   True, [], Margin())  # the last search that held
        while True:
            done = self._search(active, ranked, limit, candidates)
            self.phases.append(PhaseRecord(searched_on=active.label, met_there=done.met, kept_float=len(done.kept),
                                           margin=done.margin, missed_on=done.missed))
            searched = set(active.evaluators) if isinstance(active, Combined) else set()
            if not done.met and held_before is not None:
                # no kept set holds on the target that missed: keeping more float there buys nothing; write the
                # model that holds where it held, marked failing on that target
                done = held_before
                done.final = self.build(done.kept)
                done.met, done.missed = False, checks.confirm(done.final, done.kept)
                self.phases[-1].written = f"the model of the search on {done.active.label}, which held there"
                return done
            if done.met:
                held_before = done
            new = [name for name in done.missed if name not in searched]
            if not new or (not done.met and SEARCH_TARGET in checks.evaluators) or clock.stopped:
                return done  # every miss was searched for, or the search missed on a target validated on
            active = checks.search_set(sorted(searched | set(done.missed)))

    def _search(self, active: Evaluator | Combined, ranked: list[str], limit: int, candidates: int) -> _Done:
        """One search on ``active``'s runtimes, checked on the held-back samples and confirmed on every target."""
        search = _Search(self.build, active, ranked, 1.0, self.on_progress, self.clock)
        search.measured[frozenset()] = _full_on(active, self.checks, self.full_model, self.full)
        search.fraction = _first_fraction(active, search.measured[frozenset()], self.held_count)
        kept, met, margin = _rounds(search, limit, candidates)
        for trial in search.tried:
            trial.on = active.label
        self.tried += search.tried
        self.needed |= search.needed
        final = self.build(kept)
        measured = search.measured.get(frozenset(kept))
        if measured is None or not measured.held_part:
            with self.clock.phase("confirm on held-back samples"):
                measured = active.measure(final, held=True)
        met = met and _holds(active, measured)
        self.checks.remember(kept, measured, active)
        with self.clock.phase("targets"):
            missed = self.checks.confirm(final, kept)
        return _Done(kept, final, measured, active, met, missed, margin)


class _Latency:
    """The latency-aware search (``latency``): a second search in harm-per-second order, and the front of
    the fully quantized model and both searches' results; the fastest point that holds is written."""

    def __init__(self, build: Builder, active: Evaluator | Combined, checks: TargetChecks, clock: Clock,
                 on_progress: Callable[[str], None], held_count: int) -> None:
        self.build, self.active, self.checks, self.clock = build, active, checks, clock
        self.on_progress, self.held_count = on_progress, held_count
        self.tried: list[Trial] = []

    def front(self, ranked: list[Ranked], limit: int, float_model: Path, full_model: onnx.ModelProto,
              full: Measured, kept: list[str], measured: Measured | CombinedMeasured, timing: Sequence[TimingSource],
              feeds: list[Feeds]) -> tuple[list[str], onnx.ModelProto, Measured | CombinedMeasured, FrontRecord]:
        names = [item.name for item in ranked]
        self.on_progress("accuracy budget: timing the candidates kept float")
        with self.clock.phase("latency: timing"):
            costs, how = measure_costs(timing, float_model, full_model, names, feeds)
        if not costs:  # no runtime could time it: the harm-ranked set stays
            return kept, self.build(kept), measured, FrontRecord(timing=how, points=[], chosen=None)
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
        front = FrontRecord(timing=how, chosen_by=primary, points=[point.finding() for point in points],
                            chosen=chosen)
        return kept, final, measured, front


def _full_on(active: Evaluator | Combined, checks: TargetChecks, full_model: onnx.ModelProto,
             full: Measured) -> Measured | CombinedMeasured:
    """The fully quantized model measured on the search's runtimes, from what was measured already."""
    if not isinstance(active, Combined):
        return full
    return CombinedMeasured({name: checks.measured(name, full_model, []) for name in active.evaluators})


def _rounds(search: _Search, limit: int, candidates: int) -> tuple[list[str], bool, Margin]:
    """Search, prune and confirm, tightening the error fraction after a held-back miss; (kept, met, margin)."""
    margin = Margin(first_error_fraction=round(search.fraction, 4))
    best: list[str] | None = None
    failing = 0  # a prefix failing at one fraction fails at every smaller one: later rounds start above it
    try:
        for round_number in range(1, ROUNDS + 1):
            margin.error_fraction, margin.rounds = round(search.fraction, 4), round_number
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
            search.tried.append(Trial(phase, len(best), held.passed if held else None))
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


def _both(evaluate: Evaluator | Combined, measured: Measured | CombinedMeasured) -> BudgetComparison:
    both: BudgetComparison = {"search": summary(evaluate.on_search(measured), evaluate.tolerance)}
    if measured.held_part:
        both["held_back"] = summary(evaluate.on_held(measured), evaluate.tolerance)
    return both
