"""The benchmark stage: config rules, statistics, interleaved rounds, bound inputs, settings and memory."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from pydantic import ValidationError

from qdeploy.calibration import data_context
from qdeploy.core.context import Artifact
from qdeploy.stages import benchmark
from qdeploy.stages.benchmark import BenchmarkConfig, median_confidence_interval, summarize
from qdeploy.stages.benchmark._runtime import TIMED_CALLS, MemoryProbe, bind_inputs
from tests.helpers.models import tiny_cnn

CTX = data_context("*", Path("work"))  # no datasets: benchmarks feed seeded random data


def _artifact(path: Path) -> Artifact:
    return Artifact(path=path, sidecar=path.with_suffix(".json"), key=path.stem, sha256="", size_bytes=0,
                    stages=(), parent=None)


@pytest.fixture
def two_artifacts(tmp_path: Path) -> dict[str, Artifact]:
    paths = {}
    for name, channels in (("small", 4), ("large", 16)):
        path = tmp_path / f"{name}.onnx"
        onnx.save(tiny_cnn(seed=1, channels=channels), path)
        paths[name] = _artifact(path)
    return paths


def test_config_defaults_and_count_or_time_rules() -> None:
    config = BenchmarkConfig()
    assert (config.warmup_runs, config.timed_runs) == (10, 50)
    assert config.round_plan() == [10] * 5
    assert sum(BenchmarkConfig(iterations=7, rounds=3).round_plan()) == 7
    assert BenchmarkConfig(iterations=2, rounds=5).round_plan() == [1, 1]  # never an empty round
    timed = BenchmarkConfig(duration_seconds=1.0, rounds=4, warmup_seconds=0.5)
    assert timed.timed_runs is None and timed.warmup_runs == 0
    assert timed.round_plan() == [0.25] * 4
    assert timed.measure_record()["by"] == "time" and timed.measure_record()["warmup"] == "time"
    with pytest.raises(ValidationError, match=r"iterations .* or duration_seconds"):
        BenchmarkConfig(iterations=10, duration_seconds=1.0)
    with pytest.raises(ValidationError, match=r"warmup .* or warmup_seconds"):
        BenchmarkConfig(warmup=3, warmup_seconds=1.0)
    with pytest.raises(ValidationError):
        BenchmarkConfig(duration_seconds=0)
    # a dumped config validates again (sweeps and sidecars round-trip it)
    assert BenchmarkConfig.model_validate(timed.model_dump()) == timed


def test_summarize_statistics() -> None:
    rounds = [[1.0, 2.0, 3.0], [4.0, 5.0, 6.0, 7.0]]
    stats = summarize(rounds, batch=4)
    latency = stats["latency_ms"]
    assert latency["p50"] == 4.0 and latency["min"] == 1.0 and latency["max"] == 7.0
    assert latency["mean"] == pytest.approx(4.0)
    assert latency["std"] == pytest.approx(statistics.pstdev(range(1, 8)))
    assert latency["p90"] == pytest.approx(float(np.percentile(range(1, 8), 90)))
    assert latency["ci95_p50"][0] <= latency["p50"] <= latency["ci95_p50"][1]
    assert stats["throughput_per_s"] == pytest.approx(4 * 1000 / 4.0)
    assert stats["round_p50_ms"] == [2.0, 5.5] and stats["round_runs"] == [3, 4] and stats["runs"] == 7
    assert stats["noisy"] is True  # the interval spans most of the range


def test_noisy_flag_follows_the_spread() -> None:
    rng = np.random.default_rng(0)
    tight = summarize([list(10.0 + rng.normal(0, 0.05, 200))], batch=1)
    wide = summarize([list(10.0 * rng.lognormal(0, 0.8, 200))], batch=1)
    assert tight["noisy"] is False and tight["ci95_rel_width"] < 0.1
    assert wide["noisy"] is True and wide["ci95_rel_width"] > 0.1


def test_median_interval_covers_the_true_median_about_95_percent() -> None:
    rng = np.random.default_rng(1)
    trials, n, covered = 400, 41, 0
    for _ in range(trials):
        low, high = median_confidence_interval(sorted(rng.exponential(1.0, n)))
        covered += low <= np.log(2) <= high  # the median of Exp(1)
    assert 0.9 <= covered / trials <= 0.995


def test_runs_every_artifact_interleaved_with_bound_inputs(two_artifacts: dict[str, Artifact]) -> None:
    config = BenchmarkConfig(warmup=2, iterations=6, rounds=3, threads=1, busy_seconds=0)
    seen: list[str] = []
    ctx = data_context("*", Path("work"), on_progress=seen.append)
    rows = benchmark.run(two_artifacts, ["ort:cpu", "openvino:cpu"], config, ctx)
    assert [(r.variant, r.target) for r in rows] == [
        ("small", "ort:cpu"), ("large", "ort:cpu"), ("small", "openvino:cpu"), ("large", "openvino:cpu")]
    for row in rows:
        assert row.status == "ok", row.reason
        assert row.runs == 6 and row.round_runs == [2, 2, 2] and len(row.round_p50_ms) == 3
        assert row.warmup == 2 and row.threads == 1 and row.mode.startswith("sync")
        assert row.session_create_ms > 0 and row.first_run_ms > 0
        assert row.memory is None or row.memory["peak_growth_mb"] >= 0
    ort_row, ov_row = rows[0], rows[2]
    assert ort_row.timed_call == TIMED_CALLS["onnxruntime"] and ov_row.timed_call == TIMED_CALLS["openvino"]
    assert ort_row.settings["intra_op_num_threads"] == 1
    assert ov_row.settings["INFERENCE_NUM_THREADS"] == 1
    assert ov_row.settings["PERFORMANCE_HINT"] == "LATENCY" and ov_row.settings["NUM_STREAMS"] == 1
    # rounds alternate the artifacts: small, large, small, large, ...
    rounds = [message.split(" · ")[0] for message in seen if "round" in message][:4]
    assert rounds == ["small", "large", "small", "large"]


def test_time_budget_and_warmup_by_time(two_artifacts: dict[str, Artifact]) -> None:
    config = BenchmarkConfig(warmup_seconds=0.02, duration_seconds=0.06, rounds=2)
    rows = benchmark.run({"small": two_artifacts["small"]}, ["ort:cpu"], config, CTX)
    [row] = rows
    assert row.status == "ok"
    assert row.measure["by"] == "time" and row.measure["duration_seconds"] == 0.06
    assert len(row.round_runs) == 2 and all(count >= 1 for count in row.round_runs)
    assert row.runs == sum(row.round_runs) > 2  # a sub-millisecond model runs many times in 30 ms
    assert row.warmup >= 1 and row.warmup_ms >= 20


def test_targets_without_a_benchmark_give_unavailable_rows(two_artifacts: dict[str, Artifact]) -> None:
    config = BenchmarkConfig(warmup=0, iterations=1, rounds=1)
    rows = benchmark.run(two_artifacts, ["ort:cuda", "reference:cpu"], config, CTX)
    assert {row.status for row in rows} == {"unavailable"}
    assert all(row.reason for row in rows)
    assert any("fidelity checks only" in row.reason for row in rows if row.target == "reference:cpu")
    assert all(row.latency_ms is None and row.round_p50_ms == [] for row in rows)


def test_a_failure_while_timed_spares_the_other_artifacts(two_artifacts: dict[str, Artifact],
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    real_bind = benchmark.bind_inputs
    loaded = {"n": 0}

    def bind(session: Any, feeds: Any, expected: Any) -> Any:
        call, kind = real_bind(session, feeds, expected)
        loaded["n"] += 1
        if loaded["n"] == 2:  # the second artifact loaded ("large") breaks after its warm-up and first round

            def broken() -> None:
                raise RuntimeError("device lost")

            return _after(call, 4, broken), kind
        return call, kind

    monkeypatch.setattr(benchmark, "bind_inputs", bind)
    config = BenchmarkConfig(warmup=2, iterations=4, rounds=2, busy_seconds=0)
    rows = {row.variant: row for row in benchmark.run(two_artifacts, ["ort:cpu"], config, CTX)}  # type: ignore
    assert rows["small"].status == "ok" and rows["small"].runs == 4
    assert rows["large"].status == "error" and "device lost" in rows["large"].reason


def _after(call: Any, good: int, then: Any) -> Any:
    count = {"n": 0}

    def wrapped() -> Any:
        count["n"] += 1
        return call() if count["n"] <= good else then()

    return wrapped


def test_bound_call_gives_the_outputs_of_session_run(tmp_path: Path) -> None:
    from qdeploy.targets import get_target

    path = tmp_path / "m.onnx"
    onnx.save(tiny_cnn(seed=3), path)
    feeds = {"input": np.random.default_rng(0).standard_normal((1, 3, 16, 16)).astype(np.float32)}
    for target, kind in (("ort:cpu", "onnxruntime"), ("openvino:cpu", "openvino")):
        session = get_target(target).load(path)
        expected = session.run(feeds)
        call, timed = bind_inputs(session, feeds, expected)
        assert timed == TIMED_CALLS[kind]
        call()
        # a wrong expectation makes bind_inputs refuse the bound call and time Session.run instead
        wrong = {name: value + 1.0 for name, value in expected.items()}
        _, fallback = bind_inputs(session, feeds, wrong)
        assert fallback == TIMED_CALLS["session"]


def test_a_session_without_runtime_objects_is_timed_through_run() -> None:
    class Plain:
        target = "x:cpu"
        def __init__(self) -> None:
            self.output_names = ["y"]
            self.calls = 0

        def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
            self.calls += 1
            return {"y": feeds["x"] * 2}

    session = Plain()
    call, timed = bind_inputs(session, {"x": np.ones(3)}, {"y": np.ones(3) * 2})  # type: ignore[arg-type]
    call()
    assert timed == TIMED_CALLS["session"] and session.calls == 1


def test_memory_probe_sees_what_is_allocated_inside() -> None:
    probe = MemoryProbe()
    block = np.ones(64 * 1024 * 1024 // 8)  # 64 MiB, every page touched
    memory = probe.finish()
    del block
    if memory is None:
        pytest.skip("no /proc/self/status on this system")
    assert memory["peak_growth_mb"] >= 48
    assert "VmHWM" in memory["method"] or "VmRSS" in memory["method"]
