"""The benchmark stage: latency of every artifact on every target and batch size.

What is timed is inference alone: session creation and the first run are
reported apart, inputs are prepared and bound to the runtime once outside the
timed region (``timed_call`` says which call is timed; see
stages/benchmark/_runtime.py), and runs of the artifacts on one target are
interleaved in rounds so that drift of the machine hits them alike (speedups
are then taken within each round).

What is fed is the recipe's data stacked to each batch size (stages/benchmark/_data.py, docs/benchmarks.md);
each row (one artifact, target and batch size) has a time budget, ``max_seconds``, and says when it stopped
early.

Language models with a KV cache (past inputs paired with present outputs, stages/benchmark/_cache_layout.py) also
get a ``decode`` record on the row of the smallest batch size: prefill latency and per-token decode on a growing
cache, on the same sessions (stages/benchmark/_decode.py, ``benchmark.decode``).

Documented choices, recorded in every result:
- calls are synchronous, one request at a time (``mode``): the latency a single
  caller sees, which is what the speedup gates compare;
- ``threads`` sets ONNX Runtime's intra-op threads and OpenVINO's
  INFERENCE_NUM_THREADS; unset, each runtime keeps its default;
- OpenVINO CPU compiles with its default PERFORMANCE_HINT, LATENCY (one stream);
  the hint, streams and threads the compiled model really uses are read back
  into ``settings``, and a hint other than LATENCY is noted.
"""

from __future__ import annotations

import gc
import logging
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypedDict

import numpy as np

from qdeploy import targets as target_registry  # get_target read at call time: tests replace it
from qdeploy.core.errors import TargetUnavailable
from qdeploy.core.memory import release_memory
from qdeploy.core.rows import BenchmarkRow, BenchmarkStatus, StopRecord, ThroughputRow
from qdeploy.stages.benchmark._data import BenchData, explain_failure, output_shape_notes, read_data
from qdeploy.stages.benchmark._decode import DecodeOutcome, measure_decode
from qdeploy.stages.benchmark._layers_macs import node_macs
from qdeploy.stages.benchmark._machine import MachineLoadRecord
from qdeploy.stages.benchmark._precision import Shipped, load_options, precision_record, shipped_precisions
from qdeploy.stages.benchmark._resident import (
    anchored_rows,
    float32_bytes,
    session_bytes,
    split_note,
    split_to_fit,
)
from qdeploy.stages.benchmark._rounds import Turn, interleaved_rounds, median_confidence_interval
from qdeploy.stages.benchmark._runtime import MemoryProbe, bind_inputs
from qdeploy.stages.benchmark._throughput import empty_row, split_modes, throughput_rows, unmeasured_throughput
from qdeploy.stages.benchmark.config import DEFAULT_TIMED_SECONDS, MODE, NOISY_SPREAD, BenchmarkConfig

if TYPE_CHECKING:
    from qdeploy.core.context import Artifact, StageContext
    from qdeploy.targets import Session

# what other packages use (the runner: shipped_precisions, split_modes, unmeasured_throughput; its memory plan:
# float32_bytes, session_bytes)
__all__ = ["BenchmarkConfig", "RunLatency", "RunSummary", "float32_bytes", "median_confidence_interval", "node_macs",
           "run", "session_bytes", "shipped_precisions", "split_modes", "summarize", "unmeasured_throughput"]

log = logging.getLogger(__name__)

@dataclass
class _Loaded:
    """A session ready to time: its turn in the rounds (the call with its inputs bound once, the budget spent) and
    what its setup measured."""

    session: Session
    turn: Turn
    setup: dict[str, Any]


def run(artifacts: dict[str, Artifact], targets: list[str], config: BenchmarkConfig,
        ctx: StageContext, shipped: Shipped | None = None,
        session_budget: int | None = None) -> list[BenchmarkRow | ThroughputRow]:
    """Benchmark results, one per (variant, target, batch size), in the report's contract.

    ``shipped``: (variant, target) -> the inference precision validation ships it with where the device default
    missed (``_precision.shipped_precisions``); those rows time that pinned setting.  ``session_budget``: bytes
    the sessions held at once may take (``_resident``; None: every artifact of a target at once)."""
    data: BenchData | None = None
    data_error = ""
    if artifacts:
        try:
            data = read_data(ctx, config.data, next(iter(artifacts.values())).path, config.batch_sizes)
        except Exception as exc:  # bad data is every row's error, said once per row, not a crash
            log.debug("reading benchmark data failed", exc_info=True)
            data_error = f"benchmark data: {type(exc).__name__}: {exc}"
    results: list[BenchmarkRow | ThroughputRow] = []
    for target in targets:
        adapter = target_registry.get_target(target)
        available, reason = adapter.availability()
        for batch in config.batch_sizes:
            if not available or not adapter.benchmarkable:
                why = reason or f"target {target} is for fidelity checks only"
                results += _every_mode(artifacts, target, batch, config, "unavailable", why)
            elif data is None:
                results += _every_mode(artifacts, target, batch, config, "error", data_error)
            else:
                results += _measure_target(artifacts, target, batch, config, ctx, data, shipped, session_budget)
    return results


def _measure_target(artifacts: dict[str, Artifact], target: str, batch: int, config: BenchmarkConfig,
                    ctx: StageContext, data: BenchData, shipped: Shipped | None,
                    budget: int | None) -> list[BenchmarkRow | ThroughputRow]:
    """Latency and throughput rows of one target and batch, the sessions loaded in groups that fit the budget."""
    cost = {name: session_bytes(artifact, target) for name, artifact in artifacts.items()}
    anchor = next(iter(artifacts), None)
    groups = split_to_fit(artifacts, cost, budget, anchor)
    first = next((number for number, group in enumerate(groups) if anchor in group), 0)  # where its rows come from
    latency: list[BenchmarkRow | ThroughputRow] = []
    throughput: list[BenchmarkRow | ThroughputRow] = []
    for number, group in enumerate(groups):
        again = anchor if number != first and anchor in group else None  # timed again: its rows are the first's
        if config.mode in ("latency", "both"):
            latency += anchored_rows(_benchmark_target(group, target, batch, config, ctx, data, shipped), again)
            _release_between(groups)
        if config.mode in ("throughput", "both"):
            throughput += anchored_rows(throughput_rows(group, target, batch, config.throughput_settings,
                                                        len(config.round_plan()), ctx, data, shipped), again)
            _release_between(groups)
    if len(groups) > 1:
        assert budget is not None
        where = {name: group for number, group in enumerate(groups) for name in group if name != anchor
                 or number == first}
        index = {name: number for number, group in enumerate(groups) for name in group
                 if name != anchor or number == first}
        notes = {name: split_note(where[name], target, sum(cost.values()), budget) for name in artifacts}
        latency = [row.replace(notes=[*row.notes, notes[row.variant]], round_group=index[row.variant])
                   for row in latency]
        throughput = [row.replace(notes=[*row.notes, notes[row.variant]], round_group=index[row.variant])
                      for row in throughput]
    return latency + throughput


def _release_between(groups: list[dict[str, Artifact]]) -> None:
    """The closed group's sessions go back to the system before the next group loads (large models only)."""
    if len(groups) > 1:
        release_memory()


def _every_mode(artifacts: dict[str, Artifact], target: str, batch: int, config: BenchmarkConfig,
                status: BenchmarkStatus, reason: str) -> list[BenchmarkRow | ThroughputRow]:
    """The same status for every artifact in each mode the recipe asked for."""
    rows: list[BenchmarkRow | ThroughputRow] = []
    if config.mode in ("latency", "both"):
        rows += [_result(name, target, batch, status, reason) for name in artifacts]
    if config.mode in ("throughput", "both"):
        rows += [empty_row(name, target, batch, status, reason) for name in artifacts]
    return rows


def _benchmark_target(artifacts: dict[str, Artifact], target: str, batch: int, config: BenchmarkConfig,
                      ctx: StageContext, data: BenchData, shipped: Shipped | None = None) -> list[BenchmarkRow]:
    loaded: dict[str, _Loaded] = {}
    results: dict[str, BenchmarkRow] = {}
    for name, artifact in artifacts.items():
        ctx.on_progress(f"{name} · {target} · batch {batch}: loading and warming up")
        try:
            loaded[name] = _prepare(artifact, target, batch, config, data, (name, shipped))
        except TargetUnavailable as exc:
            results[name] = _result(name, target, batch, "unavailable", str(exc))
        except Exception as exc:
            log.debug("benchmark of %s on %s failed", name, target, exc_info=True)
            results[name] = _result(name, target, batch, "error", explain_failure(exc, batch, data))
    timed = interleaved_rounds({name: item.turn for name, item in loaded.items()}, config, ctx,
                               f"{target} · batch {batch}")
    decoded = _decode_outcomes(artifacts, {name: item for name, item in loaded.items() if name not in timed.failed},
                      target, batch, config, ctx, data)
    for name, item in loaded.items():
        item.session.close()
        if name in timed.failed:
            results[name] = _result(name, target, batch, "error", timed.failed[name])
            continue
        outcome = decoded.get(name, DecodeOutcome())
        measured = summarize(timed.rounds[name], batch)
        stopped = _stop_record(item, measured["runs"], config) if item.turn.stopped else None
        notes = [*item.setup["notes"], *([stopped.reason] if stopped else []),
                 *_machine_notes(timed.machine), *_capped_note(measured["runs"], config), *outcome.notes]
        decode = {"decode": outcome.record.to_dict()} if outcome.record is not None else {}  # key absent otherwise
        results[name] = BenchmarkRow(variant=name, target=target, batch_size=batch, status="ok", reason="",
                                     **{**item.setup, **measured, "notes": notes}, stopped_early=stopped,
                                     execution=item.session.executed.to_dict(), machine_load=timed.machine,
                                     **decode)
    return [results[name] for name in artifacts]


def _decode_outcomes(artifacts: dict[str, Artifact], loaded: dict[str, _Loaded], target: str, batch: int,
            config: BenchmarkConfig, ctx: StageContext, data: BenchData) -> dict[str, DecodeOutcome]:
    """Decode records of the models with a KV cache, on the row of the smallest batch size (one per artifact and
    target), timed on the sessions the latency rounds used, while they are still loaded."""
    plan = config.decode_settings
    if plan is None or batch != min(config.batch_sizes) or not loaded:
        return {}
    sessions = {name: (item.session, artifacts[name].path) for name, item in loaded.items()}
    return measure_decode(sessions, config, plan, batch, data, ctx, f"{target} · batch {batch}")


def _prepare(artifact: Artifact, target: str, batch: int, config: BenchmarkConfig, data: BenchData,
             shipped: tuple[str, Shipped | None] | None = None) -> _Loaded:
    """Load, run once and warm up one artifact; time the first two apart and probe the memory they take.
    ``shipped``: (the variant's name, the shipped pins) — the row runs the precision its artifact ships with."""
    fed = data.batch_for(artifact.path, batch)  # prepared once, outside any timed region
    gc.collect()
    probe = MemoryProbe()
    start = time.perf_counter()
    # pinned as validation ships it (float32 artifacts; a pin that held where the default missed): the verdict
    # joins the two, so they measure one config
    name, pins = shipped or ("", None)
    session = target_registry.get_target(target).load(artifact.path, threads=config.threads,
                                      **load_options(name, artifact, target, pins))
    created = time.perf_counter()
    try:
        expected = session.run(fed.feed)
        first = time.perf_counter()
        call, timed_call = bind_inputs(session, fed.feed, expected)
        bound = time.perf_counter()
        warmup_runs = _warm_up(call, config, config.row_budget)
        warmed = time.perf_counter()
    except BaseException:
        session.close()
        raise
    settings = session.runtime_settings()
    mismatches, shape_notes = output_shape_notes(artifact.path, expected)
    hint, pin_notes = precision_record(name, artifact, target, pins)
    setup = {
        "session_create_ms": (created - start) * 1e3,
        "first_run_ms": (first - created) * 1e3,
        "warmup": warmup_runs,
        "warmup_ms": (warmed - bound) * 1e3,
        "threads": config.threads,
        "mode": MODE,
        "timed_call": timed_call,
        "measure": config.measure_record(),
        "settings": settings,
        "memory": probe.finish(),
        "data": fed.info,
        "output_shapes": mismatches,
        "notes": [*pin_notes, *_setting_notes(target, settings), *shape_notes, *fed.info["notes"]],
        **hint,
    }
    typical = (warmed - bound) * 1e3 / warmup_runs if warmup_runs else (first - created) * 1e3
    spent = warmed - bound
    return _Loaded(session, Turn(call, spent=spent, stopped=spent >= config.row_budget, typical_ms=typical), setup)


def _warm_up(call: Callable[[], Any], config: BenchmarkConfig, budget: float) -> int:
    """Untimed runs by count or for a time, never past the row's budget; returns how many ran."""
    deadline = time.perf_counter() + min(budget, config.warmup_seconds_cap)
    wanted = math.inf if config.warmup_seconds is not None else config.warmup_runs
    count = 0
    while count < wanted and time.perf_counter() < deadline:
        call()
        count += 1
    return count


def _stop_record(item: _Loaded, runs: int, config: BenchmarkConfig) -> StopRecord:
    planned = config.timed_runs
    of = f" of {planned} planned" if planned is not None else ""
    return StopRecord(reason=f"stopped early: the row's time budget (max_seconds {config.row_budget:g} s) was spent "
                             f"after {item.setup['warmup']} warm-up and {runs}{of} timed runs",
                      max_seconds=config.row_budget, runs=runs, planned_runs=planned,
                      warmup_runs=item.setup["warmup"], seconds_spent=item.turn.spent)


class RunLatency(TypedDict):
    """Milliseconds per call over every timed run; ``ci95_p50``: a 95% confidence interval of the median (the
    row's ``latency_ms``, ``qdeploy.core.rows.LatencyStats`` once read back)."""

    p50: float
    p90: float
    p99: float
    mean: float
    std: float
    min: float
    max: float
    ci95_p50: list[float]


class RunSummary(TypedDict):
    """What ``summarize`` says of a row's runs: the fields it adds to a benchmark or throughput row."""

    latency_ms: RunLatency
    throughput_per_s: float | None
    runs: int
    round_runs: list[int]
    round_p50_ms: list[float]
    ci95_rel_width: float | None
    noisy: bool


def summarize(rounds: list[list[float]], batch: int) -> RunSummary:
    """Latency statistics of all runs, a confidence interval of the median, and the per-round medians."""
    runs = sorted(float(value) for round_ in rounds for value in round_)
    p50 = statistics.median(runs)
    low, high = median_confidence_interval(runs)
    spread = (high - low) / p50 if p50 > 0 else math.inf
    return {
        "latency_ms": {
            "p50": p50, "p90": _percentile(runs, 90), "p99": _percentile(runs, 99),
            "mean": statistics.fmean(runs), "std": statistics.pstdev(runs) if len(runs) > 1 else 0.0,
            "min": runs[0], "max": runs[-1], "ci95_p50": [low, high],
        },
        "throughput_per_s": batch * 1e3 / p50 if p50 > 0 else None,
        "runs": len(runs),
        "round_runs": [len(round_) for round_ in rounds],
        "round_p50_ms": [float(statistics.median(round_)) for round_ in rounds if round_],
        "ci95_rel_width": spread if math.isfinite(spread) else None,
        "noisy": bool(spread > NOISY_SPREAD),
    }


def _percentile(sorted_values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(sorted_values), q))


def _machine_notes(machine: MachineLoadRecord) -> list[str]:
    """What a busy machine did to the measurement, said on every row of the target."""
    notes = []
    if machine.get("busy"):
        notes.append(f"machine busy while timing: other processes used {machine['other_cores']:.2f} of "
                     f"{machine['cores']} cores (load average {machine.get('loadavg_after')})")
    if machine.get("extra_rounds"):
        notes.append(f"{machine['extra_rounds']} extra rounds taken: {machine['extra_rounds_reason']}")
    return notes


def _capped_note(runs: int, config: BenchmarkConfig) -> list[str]:
    """The default run count bounded by time: say how many runs a slow model got."""
    planned = config.timed_runs
    if config.round_seconds_cap is None or planned is None or runs >= planned:
        return []
    return [f"measured by time: {runs} timed runs in about {DEFAULT_TIMED_SECONDS:g} s (the default stops at "
            f"{planned} runs or {DEFAULT_TIMED_SECONDS:g} s per artifact; set benchmark.iterations for a fixed count)"]


def _setting_notes(target: str, settings: dict[str, Any]) -> list[str]:
    hint = settings.get("PERFORMANCE_HINT")
    if hint is not None and str(hint).upper() != "LATENCY":
        note = f"{target} compiled with PERFORMANCE_HINT {hint}, not LATENCY: single-request latency may suffer"
        log.warning(note)
        return [note]
    return []


def _result(variant: str, target: str, batch: int, status: BenchmarkStatus, reason: str) -> BenchmarkRow:
    return BenchmarkRow(variant=variant, target=target, batch_size=batch, status=status, reason=reason)
