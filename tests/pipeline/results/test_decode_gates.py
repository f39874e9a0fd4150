"""Gates on a language model's decode speed (decode_tokens_per_s, decode_speedup): read from the benchmark row's
decode record, against the reference on the same target; a row without one fails the gate, saying why."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from qdeploy.core.rows import BenchmarkRow
from qdeploy.pipeline.recipe.schema import GateSpec
from qdeploy.pipeline.results.gates import evaluate_gates
from tests.helpers.reports import bench_row


def _row(variant: str, target: str, ms_per_token: float | None) -> BenchmarkRow:
    extra: dict[str, Any] = {}
    if ms_per_token is not None:
        extra["decode"] = {"prompt": 32, "tokens": 64, "decode_ms_per_token": ms_per_token,
                           "decode_ci95_ms": [ms_per_token * 0.9, ms_per_token * 1.1],
                           "tokens_per_s": 1e3 / ms_per_token, "cache_length": 96, "steps_run": 64, "repeats": 5}
    return BenchmarkRow.from_json(bench_row(variant, target, 10.0, [10.0, 10.1, 9.9], **extra))


BENCHMARKS = [_row("fp32", "ort:cpu", 8.0), _row("int4", "ort:cpu", 4.0), _row("int8", "ort:cpu", None),
              _row("fp32", "openvino:cpu", None), _row("int4", "openvino:cpu", 2.0)]


def _gate(metric: str, variant: str, minimum: float, target: str = "ort:cpu") -> tuple[float | None, bool | None, str]:
    spec = GateSpec(variant=variant, target=target, metric=metric, min=minimum)  # type: ignore[arg-type]
    [result] = evaluate_gates([spec], [], BENCHMARKS, "fp32", [], {})
    return result.value, result.passed, result.reason


def test_decode_tokens_per_s_passes_and_fails_on_the_rows_decode_rate() -> None:
    assert _gate("decode_tokens_per_s", "int4", 200.0) == (250.0, True, "")
    assert _gate("decode_tokens_per_s", "int4", 300.0) == (250.0, False, "")


def test_decode_speedup_is_the_reference_decode_over_the_variants_on_the_same_target() -> None:
    assert _gate("decode_speedup", "int4", 1.5) == (2.0, True, "")
    assert _gate("decode_speedup", "int4", 2.5) == (2.0, False, "")


def test_a_decode_gate_on_a_row_without_a_decode_record_fails_saying_why() -> None:
    value, passed, reason = _gate("decode_tokens_per_s", "int8", 1.0)
    assert value is None and passed is False
    assert reason == ("no decode measurement of int8 on ort:cpu: decode_tokens_per_s needs a language model with a "
                      "KV cache (past/present inputs and outputs)")
    assert _gate("decode_speedup", "int4", 1.0, "openvino:cpu") == (
        None, False, "no decode measurement of the reference fp32 on openvino:cpu")
    assert _gate("decode_speedup", "int4", 1.0, "ort:cuda") == (None, False, "no benchmark of int4 on ort:cuda")


def test_the_recipe_accepts_the_decode_gate_metrics_and_no_other() -> None:
    assert GateSpec(variant="int4", target="ort:cpu", metric="decode_speedup", min=1.5).metric == "decode_speedup"
    with pytest.raises(ValidationError):
        GateSpec(variant="int4", target="ort:cpu", metric="decode_ms", min=1.0)  # type: ignore[arg-type]
