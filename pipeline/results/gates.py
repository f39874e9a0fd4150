"""Acceptance gates: the recipe's goals checked against the measurements."""

from __future__ import annotations

from typing import TypeVar

from qdeploy.core.rows import (
    BenchmarkRow,
    BuildFailure,
    GateResult,
    ThroughputRow,
    UnmeasuredEntry,
    UnmeasuredKind,
    ValidationRow,
)
from qdeploy.core.runtimes import artifact_of, built_for, is_device_default, is_pinned_f32, is_setting_row
from qdeploy.core.values import is_finite_number
from qdeploy.pipeline.recipe.schema import GateSpec

__all__ = ["evaluate_gates", "excuse_unreadable", "find_benchmark", "gates_hold", "run_passes", "speedup",
           "unmeasured", "validations_hold"]

_Timed = TypeVar("_Timed", BenchmarkRow, ThroughputRow)

_DECODE_METRICS = ("decode_tokens_per_s", "decode_speedup")
_VALIDATION_METRICS = ("cosine", "snr_db", "max_abs_err", "mean_abs_err", "top1_agreement", "kl", "task_metric",
                       "detections_matched")


def speedup(benchmarks: list[BenchmarkRow], variant: str, target: str, batch: int, reference: str) -> float | None:
    """Reference p50 over variant p50 on the same target and batch, from the medians of shared rounds."""
    row = find_benchmark(benchmarks, variant, target, batch)
    ref = find_benchmark(benchmarks, reference, target, batch)
    if row is None or ref is None or row.status != "ok" or ref.status != "ok":
        return None
    ratios = round_ratios(ref, row)
    if ratios:
        ratios.sort()
        return ratios[len(ratios) // 2]  # drift hits both runs of a round alike
    if ref.p50 is None or not row.p50:
        return None
    return ref.p50 / row.p50


def round_ratios(ref: BenchmarkRow, row: BenchmarkRow) -> list[float]:
    """The reference's round medians over the row's, round by round: only where both were timed in the same rounds
    (a large model's groups of sessions share none: ``round_group``; a later group's row carries the rounds of the
    reference timed again beside it, its ``anchor``), else none."""
    anchor = row.anchor or {}
    if anchor.get("variant") == ref.variant and anchor.get("round_p50_ms"):
        return [r / v for r, v in zip(anchor["round_p50_ms"], row.round_p50_ms, strict=False) if v > 0]
    if ref.round_group != row.round_group:
        return []
    return [r / v for r, v in zip(ref.round_p50_ms, row.round_p50_ms, strict=False) if v > 0]


def find_benchmark(benchmarks: list[_Timed], variant: str, target: str, batch: int) -> _Timed | None:
    return next((row for row in benchmarks
                 if row.variant == variant and row.target == target and row.batch_size == batch), None)


def _measured(gate: GateSpec, validation: list[ValidationRow], benchmarks: list[BenchmarkRow],
              reference: str, sizes: dict[str, int],
              throughput: list[ThroughputRow] | None = None) -> tuple[float | None, str]:
    if gate.metric == "inferences_per_s":  # throughput mode: many requests in flight
        timed = find_benchmark(throughput or [], gate.variant, gate.target, gate.batch_size)
        if timed is None or timed.status != "ok":
            return None, f"no throughput measurement of {gate.variant} on {gate.target}" + (
                f": {timed.reason}" if timed else " (benchmark.mode throughput or both measures it)")
        return timed.inferences_per_s, ""
    if gate.metric == "size_bytes":
        size = sizes.get(artifact_of(gate.variant))  # a setting's row runs its variant's file
        return (float(size), "") if size is not None else (None, f"variant {gate.variant} has no artifact")
    if gate.metric in _VALIDATION_METRICS:
        check = next((r for r in validation if r.variant == gate.variant and r.target == gate.target), None)
        if check is None or not check.metrics.measured:
            return None, _no_row(gate, "validation", check)
        value = check.metrics.value(gate.metric)
        return value, "" if value is not None else _unmeasured(gate.metric, check)
    if gate.metric in _DECODE_METRICS:
        return _decode_measured(gate, benchmarks, reference)
    if gate.metric == "speedup":
        value = speedup(benchmarks, gate.variant, gate.target, gate.batch_size, reference)
        return value, "" if value is not None else f"no benchmark of {gate.variant} and {reference} on {gate.target}"
    row = find_benchmark(benchmarks, gate.variant, gate.target, gate.batch_size)
    if row is None or row.status != "ok":
        return None, _no_row(gate, "benchmark", row)
    if gate.metric == "latency_ms":
        return row.p50, ""
    return row.throughput_per_s, ""


def _no_row(gate: GateSpec, what: str, row: BenchmarkRow | ThroughputRow | ValidationRow | None) -> str:
    """Why a gate has no measurement: the row's own reason, or why a precision setting's row does not exist."""
    if row is not None:
        return f"no {what} of {gate.variant} on {gate.target}: {row.reason}"
    if is_pinned_f32(gate.variant):
        return (f"no {what} of {gate.variant} on {gate.target}: the f32 row runs a weight-only artifact where "
                "OpenVINO's default on this CPU is below float32 (benchmark.weight_only_f32); here it is not, "
                f"or {artifact_of(gate.variant)} quantizes activations: gate {artifact_of(gate.variant)} itself")
    if is_setting_row(gate.variant):
        return (f"no {what} of {gate.variant} on {gate.target}: the default-precision row exists where "
                "OpenVINO's default on this CPU is below float32")
    return f"no {what} of {gate.variant} on {gate.target}"


def _decode_ms(row: BenchmarkRow | None) -> float | None:
    value = (row.decode or {}).get("decode_ms_per_token") if row is not None and row.status == "ok" else None
    return float(value) if is_finite_number(value) and value > 0 else None


def _decode_measured(gate: GateSpec, benchmarks: list[BenchmarkRow], reference: str) -> tuple[float | None, str]:
    """A decode gate's value from the row's decode record (a language model with a KV cache): its tokens/s, or the
    reference's decode ms per token over its own on the same target and batch."""
    row = find_benchmark(benchmarks, gate.variant, gate.target, gate.batch_size)
    if row is None or row.status != "ok":
        return None, _no_row(gate, "benchmark", row)
    mine = _decode_ms(row)
    if mine is None:  # the benchmark times decode only for a model with past/present inputs
        return None, (f"no decode measurement of {gate.variant} on {gate.target}: {gate.metric} needs a language "
                      "model with a KV cache (past/present inputs and outputs)")
    if gate.metric == "decode_tokens_per_s":
        rate = (row.decode or {}).get("tokens_per_s")
        return (float(rate) if is_finite_number(rate) else 1e3 / mine), ""
    theirs = _decode_ms(find_benchmark(benchmarks, reference, gate.target, gate.batch_size))
    if theirs is None:
        return None, f"no decode measurement of the reference {reference} on {gate.target}"
    return theirs / mine, ""


def _unmeasured(metric: str, row: ValidationRow) -> str:
    """Why a validation metric has no value on a row that was validated."""
    if metric == "task_metric":
        if not row.metrics.has("task_metric"):
            return "task_metric needs validate.metric in the recipe ('file.py:function')"
        why = next((w for w in row.warnings if w.startswith("validate.metric")), "")
        return f"the task metric gave no value{': ' + why if why else ''}"
    return f"{metric} is not measured for this output"


def evaluate_gates(gates: list[GateSpec], validation: list[ValidationRow], benchmarks: list[BenchmarkRow],
                   reference: str, failures: list[BuildFailure], sizes: dict[str, int],
                   selected: tuple[list[str], list[str]] | None = None,
                   throughput: list[ThroughputRow] | None = None) -> list[GateResult]:
    """Each gate with its measured value; a gate that cannot be measured fails, saying why.

    A gate on a variant or target left out of this run (--variant/--target) is skipped: `passed` is None.
    """
    results = []
    for gate in gates:
        if selected and (gate.variant not in [*selected[0], reference] or gate.target not in selected[1]):
            results.append(_result(gate, None, None, skipped=True,
                                   reason="its variant or target is not part of this run (--variant/--target)"))
            continue
        failed_build = next((f for f in failures if f.variant == gate.variant), None)
        if failed_build:
            value, why = None, f"variant {gate.variant} failed in stage {failed_build.stage}"
        else:
            value, why = _measured(gate, validation, benchmarks, reference, sizes, throughput)
        passed = value is not None and value == value and (gate.min is None or value >= gate.min) and (
            gate.max is None or value <= gate.max)
        results.append(_result(gate, value, passed, skipped=False, reason=why))
    return results


def _result(gate: GateSpec, value: float | None, passed: bool | None, *, skipped: bool, reason: str) -> GateResult:
    return GateResult(variant=gate.variant, target=gate.target, metric=gate.metric, min=gate.min, max=gate.max,
                      batch_size=gate.batch_size, value=value, passed=passed, skipped=skipped, reason=reason)


def validations_hold(validation: list[ValidationRow]) -> bool:
    """No (variant, target) pair failed its tolerances; errored rows are judged by ``unmeasured``.  A row whose
    target cannot read the original model (status ``unreadable``) is not a regression of its variant: it fails only
    through a gate that names its target (such a gate has nothing to measure).  Nor is a failed ``fp32@default``
    row: the reference as the device runs it unpinned, a comparison qdeploy adds on CPUs whose default is below
    float32 only (the run's verdict would otherwise depend on the CPU kind); it is not shipped, and a gate that
    names it holds the run to it."""
    return not any(row.status == "failed" and not is_device_default(row.variant) for row in validation)


def excuse_unreadable(missing: list[UnmeasuredEntry], validation: list[ValidationRow]) -> list[UnmeasuredEntry]:
    """Leave out the measurements a target could not make because it cannot read the original model: the
    report's ``unreadable_targets`` says so once for the target, and a gate on it fails by itself."""
    unreadable = {(row.variant, row.target) for row in validation if row.unreadable}
    return [entry for entry in missing if (entry.variant, entry.target) not in unreadable]


def run_passes(gates: list[GateResult], validation: list[ValidationRow], failures: list[BuildFailure],
               missing: list[UnmeasuredEntry]) -> bool:
    """The run's verdict: every variant built, every gate and validation held, and everything the recipe asked
    to measure was measured (or the recipe allows that it was not)."""
    return (not failures and gates_hold(gates) and validations_hold(validation)
            and all(row.allowed for row in missing))


def unmeasured(validation: list[ValidationRow], benchmarks: list[BenchmarkRow],
               expected: tuple[list[str], list[str], list[int]], allowed: list[str]) -> list[UnmeasuredEntry]:
    """What the recipe asked to measure and could not be: errored rows, a latency that is not a number, rows
    that are missing.  ``expected`` is (variants, targets, batch sizes; none when benchmarks are off).

    Unavailable targets are not here: a target this machine lacks is reported, never a failure.  Each entry
    says whether the recipe allows it (``report.allow_unmeasured``).
    """
    variants, targets, batches = expected
    found = [*_errored("validate", validation, allowed), *_errored("benchmark", benchmarks, allowed)]
    seen = {(row.variant, row.target) for row in validation}
    found += [UnmeasuredEntry.of("validate", variant, target, None, "no validation result", allowed)
              for variant in variants for target in targets
              if (variant, target) not in seen and built_for(variant, target)]
    timed = {(row.variant, row.target, row.batch_size) for row in benchmarks}
    found += [UnmeasuredEntry.of("benchmark", variant, target, batch, "no benchmark result", allowed)
              for target in targets for batch in batches for variant in variants
              if (variant, target, batch) not in timed and built_for(variant, target)]
    return found


def _errored(kind: UnmeasuredKind, rows: list[ValidationRow] | list[BenchmarkRow],
             allowed: list[str]) -> list[UnmeasuredEntry]:
    found = []
    for row in rows:
        batch = row.batch_size if isinstance(row, BenchmarkRow) else None
        if row.status == "error":
            found.append(UnmeasuredEntry.of(kind, row.variant, row.target, batch, row.reason or "error", allowed))
        elif isinstance(row, BenchmarkRow) and row.status == "ok" and not is_finite_number(row.p50):
            found.append(UnmeasuredEntry.of(kind, row.variant, row.target, batch, "median latency is not a number",
                                            allowed))
    return found


def gates_hold(gates: list[GateResult]) -> bool:
    """Every gate that was evaluated passed (skipped gates do not count)."""
    return all(gate.passed for gate in gates if not gate.skipped)
