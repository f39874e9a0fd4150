"""The benchmark stage: latency of every artifact on every target and batch size.

What is timed is inference alone: session creation and the first run are
reported apart, inputs are prepared once outside the timed region, and runs
of the artifacts on one target are interleaved in rounds so that drift of the
machine hits them alike.  Calls are synchronous, one request at a time.
"""

from __future__ import annotations

import logging
import math
import statistics
import time
from typing import TYPE_CHECKING, Annotated, Any

import numpy as np
from pydantic import Field

from pipeline.errors import TargetUnavailable
from pipeline.tolerance import StrictModel

if TYPE_CHECKING:
    from pipeline.context import Artifact, StageContext
    from pipeline.targets import Session

log = logging.getLogger(__name__)

NOISY_SPREAD = 0.10
"""A median whose 95% confidence interval is wider than this share of it cannot rank close variants."""


class BenchmarkConfig(StrictModel):
    """The recipe's `benchmark` section."""

    enabled: bool = Field(default=True, description="Run benchmarks at all.")
    batch_sizes: list[Annotated[int, Field(ge=1)]] = Field(default=[1], description="Batch sizes to measure.")
    warmup: int = Field(default=10, ge=0, description="Untimed runs of each artifact before measuring.")
    iterations: int = Field(default=50, ge=1, description="Timed runs of each artifact.")
    rounds: int = Field(default=5, ge=1, description="Rounds the timed runs are split into, artifacts interleaved.")
    threads: int | None = Field(default=None, ge=1, description="Intra-op threads; the runtime's default when absent.")


def run(artifacts: dict[str, Artifact], targets: list[str], config: BenchmarkConfig,
        ctx: StageContext) -> list[dict[str, Any]]:
    """Benchmark results, one per (variant, target, batch size), in the report's contract."""
    from pipeline.targets import get_target

    results = []
    for target in targets:
        adapter = get_target(target)
        available, reason = adapter.availability()
        for batch in config.batch_sizes:
            if not available or not adapter.benchmarkable:
                why = reason or f"target {target} is for fidelity checks only"
                results += [_result(name, target, batch, "unavailable", why) for name in artifacts]
                continue
            results += _benchmark_target(artifacts, target, batch, config, ctx)
    return results


def _benchmark_target(artifacts: dict[str, Artifact], target: str, batch: int, config: BenchmarkConfig,
                      ctx: StageContext) -> list[dict[str, Any]]:
    loaded: dict[str, tuple[Session, dict[str, np.ndarray], dict[str, Any]]] = {}
    results: dict[str, dict[str, Any]] = {}
    for name, artifact in artifacts.items():
        ctx.on_progress(f"benchmark {name} on {target} (batch {batch}): loading")
        try:
            loaded[name] = _prepare(artifact, target, batch, config)
        except TargetUnavailable as exc:
            results[name] = _result(name, target, batch, "unavailable", str(exc))
        except Exception as exc:
            log.debug("benchmark of %s on %s failed", name, target, exc_info=True)
            results[name] = _result(name, target, batch, "error", f"{type(exc).__name__}: {exc}")
    timings = _interleaved_rounds(loaded, config, ctx, f"on {target} (batch {batch})")
    for name, (session, _, setup) in loaded.items():
        result = _result(name, target, batch, "ok", "")
        result.update(setup)
        result.update(summarize(timings[name], batch))
        result["execution"] = session.executed.to_dict()
        results[name] = result
    return [results[name] for name in artifacts]


def _prepare(artifact: Artifact, target: str, batch: int,
             config: BenchmarkConfig) -> tuple[Session, dict[str, np.ndarray], dict[str, Any]]:
    from pipeline.targets import get_target

    feeds = batch_feeds(artifact, batch)  # prepared once, outside any timed region
    start = time.perf_counter()
    session = get_target(target).load(artifact.path, threads=config.threads, pin_f32=True)
    created = time.perf_counter()
    session.run(feeds)
    first = time.perf_counter()
    for _ in range(config.warmup):
        session.run(feeds)
    setup = {
        "session_create_ms": (created - start) * 1e3,
        "first_run_ms": (first - created) * 1e3,
        "warmup": config.warmup,
        "threads": config.threads,
        "mode": "sync, one request at a time",
    }
    return session, feeds, setup


def batch_feeds(artifact: Artifact, batch: int) -> dict[str, np.ndarray]:
    """Seeded random inputs at this batch size; a static batch dimension that differs is an error."""
    from calibration.readers import model_inputs, random_samples

    infos = model_inputs(artifact.path)
    for info in infos:
        if info.shape and info.shape[0] is not None and info.shape[0] != batch:
            raise ValueError(f"input '{info.name}' has a static batch dimension of {info.shape[0]}; "
                             f"to benchmark batch {batch} give it a symbolic one (model.inputs shape ['batch', ...])")
    batched = [type(info)(info.name, (batch, *info.shape[1:]) if info.shape else (), info.dtype) for info in infos]
    return next(random_samples(batched, 1, seed=0))


def _interleaved_rounds(loaded: dict[str, tuple[Session, dict[str, np.ndarray], dict[str, Any]]],
                        config: BenchmarkConfig, ctx: StageContext, where: str) -> dict[str, list[list[float]]]:
    """Per artifact, the latencies (ms) of each round; every round runs every artifact in turn."""
    rounds = min(config.rounds, config.iterations)
    per_round = [config.iterations // rounds + (1 if index < config.iterations % rounds else 0)
                 for index in range(rounds)]
    timings: dict[str, list[list[float]]] = {name: [] for name in loaded}
    for index, count in enumerate(per_round):
        for name, (session, feeds, _) in loaded.items():
            ctx.on_progress(f"benchmark {name} {where}: round {index + 1}/{rounds}")
            timings[name].append(_time_runs(session, feeds, count))
    return timings


def _time_runs(session: Session, feeds: dict[str, np.ndarray], count: int) -> list[float]:
    latencies = []
    for _ in range(count):
        start = time.perf_counter_ns()
        session.run(feeds)
        latencies.append((time.perf_counter_ns() - start) / 1e6)
    return latencies


def summarize(rounds: list[list[float]], batch: int) -> dict[str, Any]:
    """Latency statistics of all runs, a confidence interval of the median, and the per-round medians."""
    runs = sorted(value for round_ in rounds for value in round_)
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
        "round_p50_ms": [statistics.median(round_) for round_ in rounds if round_],
        "noisy": spread > NOISY_SPREAD,
    }


def _percentile(sorted_values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(sorted_values), q))


def median_confidence_interval(sorted_values: list[float], z: float = 1.96) -> tuple[float, float]:
    """Distribution-free 95% interval of the median from order statistics (normal approximation of the binomial)."""
    n = len(sorted_values)
    if n < 3:
        return sorted_values[0], sorted_values[-1]
    half_width = z * math.sqrt(n) / 2
    low = max(0, math.floor(n / 2 - half_width) - 1)
    high = min(n - 1, math.ceil(n / 2 + half_width))
    return sorted_values[low], sorted_values[high]


def _result(variant: str, target: str, batch: int, status: str, reason: str) -> dict[str, Any]:
    return {"variant": variant, "target": target, "batch_size": batch, "status": status, "reason": reason,
            "latency_ms": None, "throughput_per_s": None, "runs": 0, "session_create_ms": None}
