"""Timed rounds of the artifacts of one target, interleaved, each isolated from the one timed before it; on a busy
machine, extra rounds until the rounds can rank the artifacts or the recipe's time for that is spent.

Every round runs every artifact in turn, so drift of the machine hits them alike.  Before an artifact's turn the
process is quiesced (``_machine.quiesce``: no runtime pool left spinning) and the artifact re-warmed with untimed
runs, so each turn measures what a plain loop over that one session measures.  An artifact whose row budget
(max_seconds) is spent stops, keeping the rounds it ran (it runs at least once).
"""

from __future__ import annotations

import logging
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from qdeploy.core.ranking import distinguishable
from qdeploy.stages.benchmark._machine import MachineLoad, MachineLoadRecord, quiesce, rewarm_runs
from qdeploy.stages.benchmark.config import MAX_EXTRA_ROUND_FACTOR, BenchmarkConfig

if TYPE_CHECKING:
    from qdeploy.core.context import StageContext

__all__ = ["WIDE_ROUND_SPREAD", "Timed", "Turn", "interleaved_rounds", "median_confidence_interval", "time_for",
           "time_runs"]

log = logging.getLogger(__name__)

WIDE_ROUND_SPREAD = 0.3
"""Round medians of one artifact spreading more than this share of their median: the machine moved under it."""


@dataclass
class Turn:
    """What the rounds need of one loaded artifact: its bound call and the share of its row budget spent."""

    call: Callable[[], Any]
    spent: float = 0.0
    stopped: bool = False
    typical_ms: float | None = None
    """A run's time before any round (from the warm-up), so a slow model is not re-warmed before its first."""


@dataclass
class Timed:
    """Per artifact the latencies (ms) of each round, why an artifact failed while timed, how busy the machine was."""

    rounds: dict[str, list[list[float]]]
    failed: dict[str, str] = field(default_factory=dict)
    machine: MachineLoadRecord = field(default_factory=MachineLoadRecord)


def interleaved_rounds(turns: dict[str, Turn], config: BenchmarkConfig, ctx: StageContext, where: str) -> Timed:
    """The planned rounds, then, while the machine is busy and the rounds cannot rank the artifacts, more rounds
    within ``config.busy_seconds``; ``Timed.machine`` records the load and the extra rounds taken."""
    plan = config.round_plan()
    timed = Timed({name: [] for name in turns})
    load = MachineLoad.start()
    for index, budget in enumerate(plan):
        _one_round(turns, timed, budget, config, ctx, f"{where}: round {index + 1}/{len(plan)}")
    extra, why = _extra_rounds(turns, timed, plan, config, ctx, where, load)
    timed.machine = {**load.record(), "extra_rounds": extra, "extra_rounds_reason": why}
    if timed.machine["busy"]:
        log.warning("%s: the machine was busy while timing (other processes used %.2f cores)", where,
                    timed.machine["other_cores"])
    return timed


def _extra_rounds(turns: dict[str, Turn], timed: Timed, plan: list[int | float], config: BenchmarkConfig,
                  ctx: StageContext, where: str, load: MachineLoad) -> tuple[int, str]:
    """Rounds added after the plan while the machine is busy and the ranking undecided; how many, and why."""
    deadline = time.perf_counter() + config.busy_seconds
    extra = 0
    why = ""
    while extra < MAX_EXTRA_ROUND_FACTOR * len(plan) and time.perf_counter() < deadline:
        busy = _busy_reason(timed, load)
        undecided = _undecided(timed)
        if not busy or not undecided:
            break
        why = f"{busy}; {undecided}"
        if extra == 0:
            log.info("%s: %s: taking more rounds (up to %g s)", where, why, config.busy_seconds)
        _one_round(turns, timed, plan[extra % len(plan)], config, ctx, f"{where}: extra round {extra + 1}")
        extra += 1
    return extra, why


def _busy_reason(timed: Timed, load: MachineLoad) -> str:
    """Why the machine looks busy ('' when it does not): other processes on the cores, or rounds spread widely."""
    record = load.record()
    if record["busy"]:
        return f"other processes used {record['other_cores']:.2f} of {record['cores']} cores"
    for name, rounds in timed.rounds.items():
        medians = [statistics.median(r) for r in rounds if r]
        if len(medians) >= 2 and (max(medians) - min(medians)) > WIDE_ROUND_SPREAD * statistics.median(medians):
            return f"{name}'s round medians spread from {min(medians):.3g} to {max(medians):.3g} ms"
    return ""


def _undecided(timed: Timed) -> str:
    """'' when the rounds rank the fastest artifact ahead of every other; else which pair they cannot tell apart."""
    scored = {name: _scores(rounds) for name, rounds in timed.rounds.items()
              if name not in timed.failed and any(rounds)}
    if len(scored) < 2:
        return ""
    best = min(scored, key=lambda name: scored[name][0])
    for name, (_, medians, interval) in scored.items():
        if name != best and not distinguishable(medians, scored[best][1], interval, scored[best][2]):
            return f"the rounds cannot yet tell {name} from {best}"
    return ""


def _scores(rounds: list[list[float]]) -> tuple[float, list[float], tuple[float, float]]:
    runs = sorted(value for round_ in rounds for value in round_)
    medians = [statistics.median(round_) for round_ in rounds if round_]
    return statistics.median(runs), medians, median_confidence_interval(runs)


def _one_round(turns: dict[str, Turn], timed: Timed, budget: int | float, config: BenchmarkConfig,
               ctx: StageContext, label: str) -> None:
    """Each artifact's turn: quiesce, re-warm, time; an artifact whose row budget is spent sits out."""
    cap = config.round_seconds_cap
    for name, turn in turns.items():
        left = config.row_budget - turn.spent
        if name in timed.failed:
            continue
        if left <= 0 and timed.rounds[name]:
            turn.stopped = True
            continue
        ctx.on_progress(f"{name} · {label}")
        quiesce()  # no runtime pool of the artifact timed before is still spinning
        started = time.perf_counter()
        try:
            for _ in range(rewarm_runs(_last_median(timed.rounds[name]) or turn.typical_ms)):
                turn.call()
            if isinstance(budget, int):
                seconds = max(left - (time.perf_counter() - started), 0.0)
                runs = time_runs(turn.call, budget, min(seconds, cap) if cap is not None else seconds)
                turn.stopped = turn.stopped or (len(runs) < budget and (cap is None or seconds < cap))
            else:
                runs = time_for(turn.call, min(budget, max(left, 0.0)))
                turn.stopped = turn.stopped or left < budget
        except Exception as exc:  # one artifact failing mid-measurement must not lose the others
            log.debug("timing %s %s failed", name, label, exc_info=True)
            timed.failed[name] = f"{label}: {type(exc).__name__}: {exc}"
            continue
        finally:
            turn.spent += time.perf_counter() - started
        timed.rounds[name].append(runs)


def _last_median(rounds: list[list[float]]) -> float | None:
    return statistics.median(rounds[-1]) if rounds and rounds[-1] else None


def time_runs(call: Callable[[], Any], count: int, seconds: float = math.inf) -> list[float]:
    """Latency (ms) of up to `count` synchronous calls, stopping once `seconds` have passed; at least one call."""
    deadline = time.perf_counter_ns() + (int(seconds * 1e9) if math.isfinite(seconds) else 2**62)
    latencies: list[float] = []
    while len(latencies) < count:
        start = time.perf_counter_ns()
        call()
        end = time.perf_counter_ns()
        latencies.append((end - start) / 1e6)
        if end >= deadline:
            break
    return latencies


def time_for(call: Callable[[], Any], seconds: float) -> list[float]:
    """Latency (ms) of synchronous calls until `seconds` have passed; at least one call."""
    deadline = time.perf_counter_ns() + int(seconds * 1e9)
    latencies = []
    while True:
        start = time.perf_counter_ns()
        call()
        end = time.perf_counter_ns()
        latencies.append((end - start) / 1e6)
        if end >= deadline:
            return latencies


def median_confidence_interval(sorted_values: list[float], z: float = 1.96) -> tuple[float, float]:
    """Distribution-free 95% interval of the median from order statistics (normal approximation of the binomial)."""
    n = len(sorted_values)
    if n < 3:
        return sorted_values[0], sorted_values[-1]
    half_width = z * math.sqrt(n) / 2
    low = max(0, math.floor(n / 2 - half_width) - 1)
    high = min(n - 1, math.ceil(n / 2 + half_width))
    return sorted_values[low], sorted_values[high]
