"""The typed records of a run's verdict (gates, build failures, unmeasured entries): what the real producers build
serializes to exactly the dicts report.json held before the records were typed, key for key and in that order,
and parses back without losing a field."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest
from pydantic import ValidationError

from qdeploy.core.errors import QdeployInputError, StageError
from qdeploy.core.rows import (
    BenchmarkRow,
    BuildFailure,
    GateResult,
    ResultRow,
    ThroughputRow,
    UnmeasuredEntry,
    ValidationRow,
)
from qdeploy.pipeline.recipe.schema import GateSpec
from qdeploy.pipeline.results.gates import evaluate_gates, gates_hold, run_passes, unmeasured
from qdeploy.pipeline.run.runner import _record_failure
from qdeploy.stages.benchmark import unmeasured_throughput

SKIPPED = "its variant or target is not part of this run (--variant/--target)"
NO_TASK_METRIC = "task_metric needs validate.metric in the recipe ('file.py:function')"

# what qdeploy.pipeline.results.gates.evaluate_gates returned, as dicts, for GATES below (before the records were typed)
GATE_DICTS = [
    {"variant": "int8", "target": "ort:cpu", "metric": "cosine", "min": 0.999, "max": None, "batch_size": 1,
     "value": 0.99, "passed": False, "skipped": False, "reason": ""},
    {"variant": "int8", "target": "ort:cpu", "metric": "speedup", "min": 1.5, "max": None, "batch_size": 1,
     "value": 2.0, "passed": True, "skipped": False, "reason": ""},
    {"variant": "int8", "target": "ort:cpu", "metric": "latency_ms", "min": None, "max": 3.0, "batch_size": 1,
     "value": 2.0, "passed": True, "skipped": False, "reason": ""},
    {"variant": "fp32", "target": "ort:cpu", "metric": "throughput_per_s", "min": 100.0, "max": 1000.0,
     "batch_size": 1, "value": 250.0, "passed": True, "skipped": False, "reason": ""},
    {"variant": "int8", "target": "ort:cpu", "metric": "inferences_per_s", "min": 100.0, "max": None,
     "batch_size": 1, "value": 500.0, "passed": True, "skipped": False, "reason": ""},
    {"variant": "int8", "target": "ort:cpu", "metric": "size_bytes", "min": None, "max": 1000.0, "batch_size": 1,
     "value": 1000.0, "passed": True, "skipped": False, "reason": ""},
    {"variant": "int8", "target": "ort:cpu", "metric": "task_metric", "min": 0.5, "max": None, "batch_size": 1,
     "value": None, "passed": False, "skipped": False, "reason": NO_TASK_METRIC},
    {"variant": "int8", "target": "ort:cuda", "metric": "latency_ms", "min": None, "max": 3.0, "batch_size": 2,
     "value": None, "passed": False, "skipped": False, "reason": "no benchmark of int8 on ort:cuda"},
    {"variant": "broken", "target": "ort:cpu", "metric": "cosine", "min": 0.9, "max": None, "batch_size": 1,
     "value": None, "passed": False, "skipped": False, "reason": "variant broken failed in stage quantize"},
    {"variant": "int8", "target": "openvino:cpu", "metric": "latency_ms", "min": None, "max": 3.0, "batch_size": 1,
     "value": None, "passed": None, "skipped": True, "reason": SKIPPED},
]
GATES = [{key: gate[key] for key in ("variant", "target", "metric", "min", "max", "batch_size")}
         for gate in GATE_DICTS]

# what qdeploy.pipeline.results.gates.unmeasured and unmeasured_throughput returned for the rows below
UNMEASURED_DICTS = [
    {"kind": "validate", "variant": "fp16", "target": "ort:cpu", "reason": "error", "allowed": True},
    {"kind": "benchmark", "variant": "fp16", "target": "ort:cpu", "reason": "median latency is not a number",
     "batch_size": 1, "allowed": False},
    {"kind": "validate", "variant": "fp32", "target": "openvino:cpu", "reason": "no validation result",
     "allowed": True},
    {"kind": "validate", "variant": "fp16", "target": "openvino:cpu", "reason": "no validation result",
     "allowed": True},
    {"kind": "validate", "variant": "int8@ort", "target": "ort:cpu", "reason": "no validation result",
     "allowed": True},
    {"kind": "benchmark", "variant": "int8@ort", "target": "ort:cpu", "reason": "no benchmark result",
     "batch_size": 1, "allowed": False},
    {"kind": "benchmark", "variant": "fp32", "target": "openvino:cpu", "reason": "no benchmark result",
     "batch_size": 1, "allowed": False},
    {"kind": "benchmark", "variant": "fp16", "target": "openvino:cpu", "reason": "no benchmark result",
     "batch_size": 1, "allowed": False},
]
THROUGHPUT_DICTS = [
    {"kind": "benchmark", "variant": "a", "target": "t", "reason": "throughput: boom", "batch_size": 1,
     "allowed": True},
    {"kind": "benchmark", "variant": "b", "target": "t", "reason": "throughput: no result", "batch_size": 1,
     "allowed": True},
    {"kind": "benchmark", "variant": "c", "target": "t", "reason": "throughput: no result", "batch_size": 1,
     "allowed": True},
    {"kind": "benchmark", "variant": "a", "target": "t", "reason": "throughput: no result", "batch_size": 2,
     "allowed": True},
    {"kind": "benchmark", "variant": "c", "target": "t", "reason": "throughput: no result", "batch_size": 2,
     "allowed": True},
]


def _bench(variant: str, target: str, status: str, p50: float | None = None, rounds: tuple[float, ...] = (),
           reason: str = "") -> BenchmarkRow:
    stats = {key: p50 for key in ("p50", "p90", "p99", "mean", "min", "max")} if p50 is not None else None
    return BenchmarkRow(variant=variant, target=target, batch_size=1, status=status, reason=reason,
                        latency_ms=stats, round_p50_ms=list(rounds), throughput_per_s=1000 / p50 if p50 else None)


VALIDATION = [
    ValidationRow(variant="fp32", target="ort:cpu", status="passed", metrics={"cosine": 1.0, "snr_db": 200.0}),
    ValidationRow(variant="int8", target="ort:cpu", status="failed", reason="cosine 0.99 < 0.999",
                  metrics={"cosine": 0.99, "snr_db": 20.0}),
    ValidationRow(variant="int8", target="ort:cuda", status="unavailable", reason="no CUDA"),
]
BENCHMARKS = [_bench("fp32", "ort:cpu", "ok", 4.0, (4.0, 4.4, 3.9)), _bench("int8", "ort:cpu", "ok", 2.0, (2.0,) * 3),
              _bench("int8", "ort:cuda", "unavailable", reason="no CUDA")]
FAILURE = BuildFailure(variant="broken", stage="quantize", reason="exclude_nodes names ['x']", kind="stage")


def _exactly(records: list[Any], expected: list[dict[str, Any]]) -> None:
    """Same keys in the same order and same values as the dicts, through JSON and back without a loss."""
    written = [record.to_json() for record in records]
    assert written == expected
    assert [list(row) for row in written] == [list(row) for row in expected]
    model = type(records[0])
    parsed = [model.from_json(row) for row in json.loads(json.dumps(written))]
    assert parsed == records and [row.to_json() for row in parsed] == expected


def _gates() -> list[GateResult]:
    throughput = [ThroughputRow(variant="int8", target="ort:cpu", batch_size=1, status="ok", inferences_per_s=500.0)]
    return evaluate_gates([GateSpec(**gate) for gate in GATES], VALIDATION, BENCHMARKS, "fp32", [FAILURE],
                          {"fp32": 4000, "int8": 1000}, selected=(["fp32", "int8", "broken"], ["ort:cpu", "ort:cuda"]),
                          throughput=throughput)


def test_evaluated_gates_serialize_as_report_json_always_had_them() -> None:
    gates = _gates()
    assert all(isinstance(gate, GateResult) for gate in gates)
    _exactly(gates, GATE_DICTS)
    assert not gates_hold(gates) and gates_hold([gate for gate in gates if gate.passed is not False])
    assert gates[-1].skipped and gates[-1].passed is None  # skipped gates never hold a run back


def test_unmeasured_entries_serialize_as_report_json_always_had_them() -> None:
    validation = [VALIDATION[0], ValidationRow(variant="fp16", target="ort:cpu", status="error", reason="")]
    benchmarks = [BENCHMARKS[0], _bench("fp16", "ort:cpu", "ok", float("nan"))]
    found = unmeasured(validation, benchmarks, (["fp32", "fp16", "int8@ort"], ["ort:cpu", "openvino:cpu"], [1]),
                       allowed=["validate"])
    _exactly(found, UNMEASURED_DICTS)
    assert not found[0].has("batch_size") and found[1].has("batch_size")  # absent, not null, on validate entries
    rows = [ThroughputRow(variant="a", target="t", batch_size=1, status="error", reason="boom"),
            ThroughputRow(variant="b", target="t", batch_size=2, status="unavailable", reason="no")]
    _exactly(unmeasured_throughput(rows, (["a", "b", "c"], ["t"], [1, 2]), allowed=["benchmark"]), THROUGHPUT_DICTS)
    assert not run_passes([], validation, [], found)
    assert run_passes([], validation, [], [entry for entry in found if entry.allowed])


def test_build_failures_say_the_stage_and_whether_the_input_was_wrong() -> None:
    state: Any = SimpleNamespace(failures=[], input_error=False)  # the runner's state, as far as it is used
    _record_failure(state, "int8", "quantize", StageError("quantize", "int8", "already quantized"))
    assert not state.input_error
    _record_failure(state, "fp16", "fp16", QdeployInputError("no such dataset 'calib'"))
    assert state.input_error
    _exactly(state.failures, [
        {"variant": "int8", "stage": "quantize", "reason": "already quantized", "kind": "stage"},
        {"variant": "fp16", "stage": "fp16", "reason": "no such dataset 'calib'", "kind": "input"},
    ])
    assert not run_passes([], [], state.failures, [])


@pytest.mark.parametrize(("model", "data"), [
    (GateResult, {**GATE_DICTS[0], "passed": None, "skiped": True}),
    (GateResult, {key: value for key, value in GATE_DICTS[0].items() if key != "reason"}),
    (BuildFailure, {"variant": "a", "stage": "fp16", "reason": "x", "kind": "crash"}),
    (UnmeasuredEntry, {**UNMEASURED_DICTS[0], "kind": "latency"}),
    (UnmeasuredEntry, {key: value for key, value in UNMEASURED_DICTS[0].items() if key != "allowed"}),
])
def test_a_record_with_a_wrong_or_missing_key_is_an_error(model: type[ResultRow], data: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        model.from_json(data)


def test_a_validate_entry_has_no_batch_size_even_when_given_one() -> None:
    entry = UnmeasuredEntry.of("validate", "a", "t", 4, "no validation result", ["benchmark"])
    assert entry.to_json() == {"kind": "validate", "variant": "a", "target": "t", "reason": "no validation result",
                               "allowed": False}
    assert UnmeasuredEntry.of("benchmark", "a", "t", 4, "x", ["benchmark"]).to_json()["batch_size"] == 4
