"""Throughput mode of the benchmark stage: inferences per second with many requests in flight.

Every artifact on a target gets a request pool (qdeploy/targets/pool.py: OpenVINO's THROUGHPUT hint and
AsyncInferQueue, ONNX Runtime's concurrent callers over one session), is warmed up, and is then run in rounds
interleaved with the other artifacts, as the latency mode does, so that drift of a shared machine hits them
alike; ratios to the reference are taken per round (pipeline/report/throughput.py).  A row reports the
inferences per second over all rounds, each round's rate, the requests in flight, streams and threads per
request, and the latency of each request at that load.
"""

from __future__ import annotations

import logging
import statistics
from typing import TYPE_CHECKING, Any, TypedDict

import numpy as np

from qdeploy.core.errors import TargetUnavailable
from qdeploy.core.rows import BenchmarkRow, BenchmarkStatus, ThroughputRow, UnmeasuredEntry
from qdeploy.core.runtimes import built_for
from qdeploy.stages.benchmark._data import BenchData, explain_failure
from qdeploy.stages.benchmark._machine import quiesce
from qdeploy.stages.benchmark._precision import Shipped, load_options, precision_record
from qdeploy.stages.benchmark.config import ThroughputConfig
from qdeploy.targets import pool as request_pool  # open_pool read at call time: tests replace it

if TYPE_CHECKING:
    from qdeploy.core.context import Artifact, StageContext
    from qdeploy.targets.pool import RequestPool

log = logging.getLogger(__name__)

def split_modes(rows: list[BenchmarkRow | ThroughputRow]) -> tuple[list[BenchmarkRow], list[ThroughputRow]]:
    """(latency rows, throughput rows) of the benchmark stage's result."""
    return ([row for row in rows if isinstance(row, BenchmarkRow)],
            [row for row in rows if isinstance(row, ThroughputRow)])


def throughput_rows(artifacts: dict[str, Artifact], target: str, batch: int, config: ThroughputConfig,
                    rounds: int, ctx: StageContext, data: BenchData,
                    shipped: Shipped | None = None) -> list[ThroughputRow]:
    """One throughput row per artifact on one target and batch size, each at the precision it ships with."""
    pools: dict[str, RequestPool] = {}
    rows: dict[str, ThroughputRow] = {}
    try:
        for name, artifact in artifacts.items():
            ctx.on_progress(f"{name} · {target} · batch {batch}: throughput, opening requests and warming up")
            try:
                pools[name] = request_pool.open_pool(target, artifact.path,
                                                     data.batch_for(artifact.path, batch).feed, config.fixed_requests,
                                                     **load_options(name, artifact, target, shipped))
                if config.warmup_seconds:
                    pools[name].run_for(config.warmup_seconds)
            except TargetUnavailable as exc:
                rows[name] = empty_row(name, target, batch, "unavailable", str(exc))
            except Exception as exc:
                log.debug("throughput of %s on %s failed", name, target, exc_info=True)
                rows[name] = empty_row(name, target, batch, "error", explain_failure(exc, batch, data))
        rows.update(_rounds(pools, target, batch, config.seconds / rounds, rounds, ctx))
        for name in pools:
            rows[name] = _with_precision(rows[name], name, artifacts[name], target, shipped)
    finally:
        for pool in pools.values():
            pool.close()
    return [rows[name] for name in artifacts]


def _rounds(pools: dict[str, RequestPool], target: str, batch: int, seconds: float, rounds: int,
            ctx: StageContext) -> dict[str, ThroughputRow]:
    """Interleaved rounds: in each, every pool runs for `seconds` in turn."""
    measured: dict[str, list[tuple[int, float, list[float]]]] = {name: [] for name in pools}
    failed: dict[str, str] = {}
    for index in range(rounds):
        for name, pool in pools.items():
            if name in failed:
                continue
            ctx.on_progress(f"{name} · {target} · batch {batch}: throughput round {index + 1}/{rounds}")
            quiesce()  # the pool that ran before leaves no thread spinning into this one's seconds
            try:
                measured[name].append(pool.run_for(seconds))
            except Exception as exc:  # one artifact failing must not lose the others
                log.debug("throughput round of %s on %s failed", name, target, exc_info=True)
                failed[name] = f"throughput round {index + 1}: {type(exc).__name__}: {exc}"
    rows = {}
    for name, pool in pools.items():
        if name in failed:
            rows[name] = empty_row(name, target, batch, "error", failed[name])
        else:
            rows[name] = ThroughputRow(variant=name, target=target, batch_size=batch, status="ok", reason="",
                                       **summarize(measured[name], batch), **_pool_record(pool))
    return rows


def _with_precision(row: ThroughputRow, name: str, artifact: Artifact, target: str,
                    shipped: Shipped | None) -> ThroughputRow:
    """A measured row says which INFERENCE_PRECISION_HINT its requests used."""
    if row.status != "ok":
        return row
    hint, notes = precision_record(name, artifact, target, shipped)
    return row.replace(**hint, notes=[*notes, *row.notes]) if hint or notes else row


class PoolRecord(TypedDict):
    """How the requests were kept in flight (a throughput row's ``pool``); ``settings``: the runtime's own."""

    requests_in_flight: int
    streams: int
    threads_per_request: int
    call: str
    settings: dict[str, Any]


class ThroughputSummary(TypedDict):
    """Inferences per second over all rounds and per round, and the latency of each request at that load."""

    inferences_per_s: float | None
    round_inferences_per_s: list[float]
    inferences: int
    requests_run: int
    seconds: float
    latency_ms: dict[str, float] | None
    """p50, p90, p99, mean, min, max."""
    round_spread: float | None


def _pool_record(pool: RequestPool) -> PoolRecord:
    return {"requests_in_flight": pool.requests, "streams": pool.streams,
            "threads_per_request": pool.threads_per_request, "call": pool.call, "settings": pool.settings()}


def summarize(rounds: list[tuple[int, float, list[float]]], batch: int) -> ThroughputSummary:
    """Inferences per second over all rounds and per round, and the latency of each request at that load."""
    count = sum(done for done, _, _ in rounds)
    seconds = sum(elapsed for _, elapsed, _ in rounds)
    latencies = np.asarray([value for _, _, values in rounds for value in values], dtype=np.float64)
    return {
        "inferences_per_s": batch * count / seconds if seconds > 0 else None,
        "round_inferences_per_s": [batch * done / elapsed for done, elapsed, _ in rounds if elapsed > 0],
        "inferences": batch * count, "requests_run": count, "seconds": seconds,
        "latency_ms": {"p50": float(np.percentile(latencies, 50)), "p90": float(np.percentile(latencies, 90)),
                       "p99": float(np.percentile(latencies, 99)), "mean": float(latencies.mean()),
                       "min": float(latencies.min()), "max": float(latencies.max())} if latencies.size else None,
        "round_spread": _spread([batch * done / elapsed for done, elapsed, _ in rounds if elapsed > 0]),
    }


def _spread(values: list[float]) -> float | None:
    """(highest - lowest) / median of the per-round rates: how far one round can be trusted."""
    if len(values) < 2:
        return None
    median = statistics.median(values)
    return (max(values) - min(values)) / median if median > 0 else None


def empty_row(variant: str, target: str, batch: int, status: BenchmarkStatus, reason: str) -> ThroughputRow:
    return ThroughputRow(variant=variant, target=target, batch_size=batch, status=status, reason=reason)


def unmeasured_throughput(rows: list[ThroughputRow], expected: tuple[list[str], list[str], list[int]],
                          allowed: list[str]) -> list[UnmeasuredEntry]:
    """Throughput the recipe asked for and did not get (errored or missing rows), as
    ``qdeploy.pipeline.results.gates.unmeasured``
    entries of kind 'benchmark'; unavailable targets are never among them."""
    variants, targets, batches = expected
    found = [(row.variant, row.target, row.batch_size, f"throughput: {row.reason or 'error'}")
             for row in rows if row.status == "error"]
    have = {(row.variant, row.target, row.batch_size) for row in rows}
    found += [(variant, target, batch, "throughput: no result") for target in targets for batch in batches
              for variant in variants if (variant, target, batch) not in have and built_for(variant, target)]
    return [UnmeasuredEntry.of("benchmark", variant, target, batch, reason, allowed)
            for variant, target, batch, reason in found]
