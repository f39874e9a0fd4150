"""The typed result rows: JSON round trips that keep absent keys absent, and typos that fail loudly."""

from __future__ import annotations

import json
from typing import Any, ClassVar

import pytest
from pydantic import ValidationError

from qdeploy.core.rows import (
    BenchmarkRow,
    ResultRow,
    StopRecord,
    ThroughputRow,
    ValidationMetrics,
    ValidationRow,
    benchmark_row_from_json,
)
from qdeploy.pipeline.recipe.schema import GateSpec
from qdeploy.pipeline.results.gates import evaluate_gates
from qdeploy.stages.benchmark import split_modes

UNAVAILABLE_KEYS = {"variant", "target", "status", "reason", "metrics", "effective_precision", "warnings",
                    "divergence", "unattainable", "noise_floor"}


def _through_json(row: ResultRow) -> dict[str, Any]:
    return json.loads(json.dumps(row.to_json()))


def test_a_row_that_was_not_measured_writes_only_the_keys_every_row_has() -> None:
    row = ValidationRow(variant="int8", target="ort:cuda", status="unavailable", reason="no CUDA")
    data = _through_json(row)
    assert set(data) == UNAVAILABLE_KEYS and data["metrics"] == {} and data["divergence"] is None
    assert not row.has("execution") and row.execution is None and not row.metrics.measured
    assert ValidationRow.from_json(data) == row and ValidationRow.from_json(data).to_json() == data


def test_optional_keys_appear_once_set_even_when_null() -> None:
    row = ValidationRow(variant="fp32", target="ort:cpu", status="passed")
    measured = row.replace(metrics=ValidationMetrics(cosine=1.0, snr_db=None), tolerance_basis=None, samples=3)
    data = _through_json(measured)
    assert set(data) == UNAVAILABLE_KEYS | {"tolerance_basis", "samples"} and data["tolerance_basis"] is None
    assert data["metrics"] == {"cosine": 1.0, "snr_db": None}  # task_metric: absent, not null, without a metric
    assert "task_metric" not in data["metrics"] and not measured.metrics.has("task_metric")
    with_metric = measured.replace(metrics=measured.metrics.replace(task_metric=None))
    assert with_metric.to_json()["metrics"] == {"cosine": 1.0, "snr_db": None, "task_metric": None}
    assert ValidationRow.from_json(with_metric.to_json()).to_json() == with_metric.to_json()
    assert row.to_json() == ValidationRow(variant="fp32", target="ort:cpu", status="passed").to_json()  # unchanged


def test_benchmark_rows_round_trip_with_their_statistics() -> None:
    stop = StopRecord(reason="stopped early", max_seconds=1.0, runs=3, planned_runs=None, warmup_runs=1,
                      seconds_spent=1.2)
    row = BenchmarkRow(variant="fp32", target="ort:cpu", batch_size=1, status="ok", runs=3, round_p50_ms=[1.0, 1.1],
                       latency_ms={"p50": 1.0, "p90": 1.2, "p99": 1.3, "mean": 1.05, "std": 0.1, "min": 0.9,
                                   "max": 1.4, "ci95_p50": [0.95, 1.1]}, stopped_early=stop, speedup=None)
    data = _through_json(row)
    assert data["latency_ms"]["ci95_p50"] == [0.95, 1.1] and data["stopped_early"]["planned_runs"] is None
    assert "speedup" in data and "speedup_range" not in data and "timed_call" not in data
    assert BenchmarkRow.from_json(data) == row and row.p50 == 1.0
    rate = ThroughputRow(variant="fp32", target="ort:cpu", batch_size=1, status="ok", inferences_per_s=9.0,
                         latency_ms={"p50": 1.0, "p90": 1.0, "p99": 1.0, "mean": 1.0, "min": 1.0, "max": 1.0})
    assert "std" not in rate.to_json()["latency_ms"] and rate.to_json()["mode"] == "throughput"
    parsed = [benchmark_row_from_json(_through_json(r)) for r in (row, rate)]
    assert [type(r) for r in parsed] == [BenchmarkRow, ThroughputRow]
    assert split_modes(parsed) == ([row], [rate])


def test_typos_fail_instead_of_reading_none() -> None:
    row = ValidationRow(variant="fp32", target="ort:cpu", status="passed", metrics={"cosine": 0.5})
    with pytest.raises(AttributeError):
        row.cosin  # noqa: B018 - a dict's .get("cosin") would have given None
    with pytest.raises(AttributeError):
        row.metrics.value("cosin")
    with pytest.raises(AttributeError):
        row.has("exectuion")
    with pytest.raises(ValidationError, match="statuss"):
        row.replace(statuss="failed")
    with pytest.raises(ValidationError, match="cosin"):
        ValidationRow(variant="fp32", target="ort:cpu", status="passed", metrics={"cosin": 0.5})
    with pytest.raises(ValidationError, match="status"):
        ValidationRow(variant="fp32", target="ort:cpu", status="pased")
    with pytest.raises(ValidationError, match="latency"):
        BenchmarkRow.from_json({"variant": "a", "target": "t", "batch_size": 1, "status": "ok", "latency": 1.0})
    with pytest.raises(ValidationError):
        row.status = "failed"  # rows are read-only: a change is a new row (replace)


def test_optional_keys_must_name_fields() -> None:
    with pytest.raises(TypeError, match="exectuion"):
        class _Broken(ResultRow):
            OPTIONAL: ClassVar[frozenset[str]] = frozenset({"exectuion"})
            execution: dict[str, Any] | None = None


def test_gates_read_the_typed_rows() -> None:
    validation = [ValidationRow(variant="int8", target="ort:cpu", status="passed", metrics={"cosine": 0.97}),
                  ValidationRow(variant="fp16", target="ort:cpu", status="error", reason="boom")]
    gates = [GateSpec(variant="int8", target="ort:cpu", metric="cosine", min=0.98),
             GateSpec(variant="fp16", target="ort:cpu", metric="cosine", min=0.98),
             GateSpec(variant="int8", target="ort:cpu", metric="task_metric", min=0.5)]
    cosine, errored, task = evaluate_gates(gates, validation, [], "fp32", [], {})
    assert cosine.value == 0.97 and cosine.passed is False
    assert errored.value is None and errored.reason == "no validation of fp16 on ort:cpu: boom"
    assert task.reason.startswith("task_metric needs validate.metric")
