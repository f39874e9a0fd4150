"""Throughput mode (issue 18): many requests in flight, each runtime its own way; rows apart from latency rows."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from pydantic import ValidationError

from qdeploy.calibration import data_context
from qdeploy.core.context import Artifact
from qdeploy.core.rows import BenchmarkRow, ThroughputRow
from qdeploy.pipeline.recipe.schema import GateSpec
from qdeploy.pipeline.report.throughput import throughput_speedup
from qdeploy.pipeline.results.gates import evaluate_gates
from qdeploy.stages import benchmark
from qdeploy.stages.benchmark import BenchmarkConfig
from qdeploy.stages.benchmark._throughput import ThroughputConfig, split_modes, summarize, unmeasured_throughput
from qdeploy.targets.pool import open_pool, physical_cores
from tests.helpers.models import tiny_cnn

CTX = data_context("*", Path("work"))  # no datasets: benchmarks feed seeded random data


@pytest.fixture
def two_artifacts(tmp_path: Path) -> dict[str, Artifact]:
    found = {}
    for name, channels in (("small", 4), ("large", 16)):
        path = tmp_path / f"{name}.onnx"
        onnx.save(tiny_cnn(seed=1, channels=channels), path)
        found[name] = Artifact(path=path, sidecar=path.with_suffix(".json"), key=name, sha256="", size_bytes=0,
                               stages=(), parent=None)
    return found


def _feed() -> dict[str, np.ndarray]:
    return {"input": np.random.default_rng(0).standard_normal((1, 3, 16, 16)).astype(np.float32)}


def test_config_refuses_throughput_settings_in_latency_mode() -> None:
    assert BenchmarkConfig().mode == "latency"  # old recipes measure what they measured before
    with pytest.raises(ValidationError, match=r"benchmark\.mode is latency"):
        BenchmarkConfig(throughput=ThroughputConfig(seconds=1))
    config = BenchmarkConfig(mode="both", throughput={"requests": 3, "seconds": 2})
    assert config.throughput_settings.fixed_requests == 3
    assert BenchmarkConfig(mode="throughput").throughput_settings.fixed_requests is None
    with pytest.raises(ValidationError):
        BenchmarkConfig(mode="fast")


def test_openvino_pool_uses_the_throughput_hint_and_its_suggested_requests(two_artifacts: dict[str, Artifact]) -> None:
    pool = open_pool("openvino:cpu", two_artifacts["small"].path, _feed(), None)
    try:
        settings = pool.settings()
        assert settings["PERFORMANCE_HINT"] == "THROUGHPUT" and settings["INFERENCE_PRECISION_HINT"] == "f32"
        assert pool.requests == settings["OPTIMAL_NUMBER_OF_INFER_REQUESTS"] >= 1
        count, elapsed, latencies = pool.run_for(0.15)
        assert count >= pool.requests and count % pool.requests == 0  # benchmark_app's loop ends on a full queue
        assert len(latencies) == count and elapsed >= 0.15 and min(latencies) > 0
    finally:
        pool.close()


def test_ort_pool_runs_one_caller_per_core_over_one_session(two_artifacts: dict[str, Artifact]) -> None:
    pool = open_pool("ort:cpu", two_artifacts["small"].path, _feed(), None)
    try:
        assert pool.requests == physical_cores() and pool.threads_per_request == 1
        assert pool.settings()["intra_op_num_threads"] == 1 and pool.settings()["sessions"] == 1
        count, elapsed, latencies = pool.run_for(0.15)
        assert count == len(latencies) >= pool.requests and elapsed >= 0.15
    finally:
        pool.close()
    fixed = open_pool("ort:cpu", two_artifacts["small"].path, _feed(), 3)
    try:
        assert fixed.requests == 3 and fixed.settings()["callers"] == 3
    finally:
        fixed.close()


def test_stage_writes_throughput_rows_interleaved_beside_latency_rows(two_artifacts: dict[str, Artifact]) -> None:
    config = BenchmarkConfig(mode="both", iterations=4, rounds=2, warmup=1,
                             throughput={"seconds": 0.2, "warmup_seconds": 0.05})
    seen: list[str] = []
    rows = benchmark.run(two_artifacts, ["ort:cpu", "openvino:cpu", "ort:cuda"], config,
                         data_context("*", Path("work"), on_progress=seen.append))
    latency, throughput = split_modes(rows)
    assert len(latency) == len(throughput) == 6
    assert all(isinstance(row, ThroughputRow) for row in throughput)
    assert all(isinstance(row, BenchmarkRow) for row in latency)
    for row in throughput:
        if row.target == "ort:cuda":
            assert row.status == "unavailable" and row.inferences_per_s is None
            continue
        assert row.status == "ok", row.reason
        assert row.inferences_per_s > 0 and len(row.round_inferences_per_s) == 2
        assert row.requests_in_flight >= 1 and row.latency_ms.p50 > 0 and row.call
    rounds = [message.split(" · ")[0] for message in seen if "throughput round" in message][:4]
    assert rounds == ["small", "large", "small", "large"]  # interleaved as the latency rounds are
    only = benchmark.run(two_artifacts, ["ort:cpu"], BenchmarkConfig(mode="throughput", rounds=1,
                                                                     throughput={"seconds": 0.05}), CTX)
    assert {row.mode for row in only} == {"throughput"}


def test_summary_and_per_round_ratio_to_the_reference() -> None:
    summary = summarize([(10, 0.5, [2.0] * 10), (30, 0.5, [1.0] * 30)], batch=2)
    assert summary["inferences_per_s"] == pytest.approx(80.0) and summary["round_inferences_per_s"] == [40.0, 120.0]
    assert summary["inferences"] == 80 and summary["latency_ms"]["p50"] == 1.0
    rows = [ThroughputRow(variant="fp32", target="t", batch_size=1, status="ok", round_inferences_per_s=[100, 50]),
            ThroughputRow(variant="int8", target="t", batch_size=1, status="ok", round_inferences_per_s=[210, 90])]
    ratio, low_high = throughput_speedup(rows, rows[1], "fp32")
    assert ratio == pytest.approx(1.95) and low_high == pytest.approx([1.8, 2.1])
    # a large model's later group: int8 timed beside fp32 timed again (anchor), not beside fp32's own row
    later = rows[1].replace(round_group=1, anchor={"variant": "fp32", "round_inferences_per_s": [200, 100]})
    ratio, low_high = throughput_speedup([rows[0].replace(round_group=0), later], later, "fp32")
    assert ratio == pytest.approx(0.975) and low_high == pytest.approx([0.9, 1.05])


def test_gates_on_inferences_per_s_read_throughput_rows_only() -> None:
    gate = GateSpec(variant="int8", target="t", metric="inferences_per_s", min=100)
    throughput = [ThroughputRow(variant="int8", target="t", batch_size=1, status="ok", inferences_per_s=150.0)]
    [result] = evaluate_gates([gate], [], [], "fp32", [], {}, throughput=throughput)
    assert result.passed and result.value == 150.0
    [missing] = evaluate_gates([gate], [], [], "fp32", [], {})
    assert not missing.passed and "benchmark.mode throughput or both" in missing.reason


def test_unmeasured_throughput_names_errors_and_gaps_never_unavailable_targets() -> None:
    rows = [ThroughputRow(variant="a", target="t", batch_size=1, status="error", reason="boom"),
            ThroughputRow(variant="b", target="t", batch_size=1, status="unavailable", reason="no")]
    found = unmeasured_throughput(rows, (["a", "b", "c"], ["t"], [1]), allowed=[])
    assert [(row.variant, row.reason) for row in found] == [("a", "throughput: boom"), ("c", "throughput: no result")]
    assert all(row.kind == "benchmark" and not row.allowed for row in found)


def test_benchmarks_pin_f32_as_validation_does(two_artifacts: dict[str, Artifact],
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Only float32 artifacts are pinned to f32, in latency and throughput mode alike: the verdict joins latency
    with validation, so both must measure one configuration (on a bf16 CPU, OpenVINO would otherwise time an
    fp16 artifact in f32 while validating it in bf16)."""
    import dataclasses

    import qdeploy.targets as targets

    pins: list[tuple[str, bool]] = []
    real = targets.get_target

    def recording(name: str) -> object:
        adapter = real(name)
        load = adapter.load

        def load_recorded(path: Path, **options: object) -> object:
            pins.append((Path(path).stem, bool(options.get("pin_f32"))))
            return load(path, **options)  # type: ignore[arg-type]

        adapter.load = load_recorded  # type: ignore[method-assign]
        return adapter

    monkeypatch.setattr(targets, "get_target", recording)
    monkeypatch.setattr("qdeploy.targets.pool.get_target", recording)
    artifacts = {"small": two_artifacts["small"],
                 "large": dataclasses.replace(two_artifacts["large"], stages=("simplify", "fp16"))}
    config = BenchmarkConfig(mode="both", iterations=1, rounds=1, warmup=0, throughput={"seconds": 0.02})
    rows = benchmark.run(artifacts, ["ort:cpu"], config, CTX)
    assert all(row.status == "ok" for row in rows), [row.reason for row in rows]
    assert set(pins) == {("small", True), ("large", False)} and len(pins) == 4
