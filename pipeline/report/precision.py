"""Which precision each row really ran, said per row from that row's own record (never copied from another row).

OpenVINO rows carry the INFERENCE_PRECISION_HINT their numbers ran with (``precision_hint``: None for the device
default) and the precision OpenVINO compiled (``execution['precision']``, read back); a validation row whose
default missed and whose pinned setting held carries ``deploy_precision`` and its ``precision_attempts``.  ONNX
Runtime rows carry the element types of their kernels; reference rows run every op in its declared type.
"""

from __future__ import annotations

from typing import Any

from qdeploy.core.report import Report
from qdeploy.core.report_parts import ExecutionRecord
from qdeploy.core.rows import BenchmarkRow, ThroughputRow, ValidationRow
from qdeploy.core.runtimes import is_pinned_f32
from qdeploy.pipeline.report.format import fmt_fidelity

__all__ = ["Row", "attempts_line", "execution_phrase", "execution_record", "ran_label", "ran_short", "same_setting",
           "settings_by_row", "speedup_sides"]

Row = ValidationRow | BenchmarkRow | ThroughputRow
_SHORT = {"float32": "f32", "f32": "f32", "bfloat16": "bf16", "bf16": "bf16", "float16": "f16", "f16": "f16"}


def _execution(row: Row) -> dict[str, Any]:
    """The row's execution record; a throughput row reads its hint back into ``settings``, not ``execution``."""
    if isinstance(row, ThroughputRow):
        hint = (row.settings or {}).get("INFERENCE_PRECISION_HINT")
        return {"runtime": "openvino", "precision": hint} if hint else {}
    return row.execution or {}


def ran_short(row: Row) -> str | None:
    """The inference precision OpenVINO read back for the row ('f32', 'bf16', 'f16'), else None."""
    ran = _execution(row).get("precision")
    return _SHORT.get(str(ran), str(ran)) if ran and ran != "declared" else None


def ran_label(row: Row) -> str:
    """What the row's numbers ran at: 'f32 (pinned)', 'bf16 (device default)', 'f32 (pinned; default bf16
    missed)', 'fp16+fp32 kernels', 'declared types'; '–' for a row that did not run."""
    execution = row.execution if not isinstance(row, ThroughputRow) else None
    if not execution:
        return "–"
    checked = row if isinstance(row, ValidationRow) else None
    if execution.get("runtime") == "openvino":
        ran = ran_short(row) or "unknown"
        if checked is not None and checked.deploy_precision and not is_pinned_f32(checked.variant):
            default = ((checked.precision_attempts or [{}])[0]).get("ran")
            return f"{ran} (pinned; default {default} missed)" if default else f"{ran} (pinned; the default missed)"
        if not row.has("precision_hint"):  # a report written before rows said it: only what was read back
            return ran
        hint = row.precision_hint
        if hint is None:
            return f"{ran} (device default)"
        return f"{ran} (pinned)" if hint == ran else f"{ran} ({hint} asked; the device ran {ran})"
    if execution.get("precision") == "declared":
        return "declared types"
    kinds = sorted(str(kind).lower() for kind in execution.get("precisions") or {})
    return f"{'+'.join(kinds)} kernels" if kinds else ((checked.precision if checked else None) or "–")


def same_setting(first: Row, second: Row) -> bool:
    """Two rows (a benchmark and a validation) ran the same precision with the same hint."""
    return ran_short(first) == ran_short(second) and first.precision_hint == second.precision_hint


def _side(precision: str | None, row: Row) -> str:
    ran = ran_short(row)
    if precision is None:
        return ran or "?"
    if ran is None:
        return precision
    return f"{precision} ({ran} float parts)" if precision == "int8" else f"{precision} ({ran})"


def speedup_sides(report: Report, row: BenchmarkRow | ThroughputRow) -> str:
    """'int8 (bf16 float parts) vs fp32 (f32)': the precisions a speedup compares, each from its own row; '' for
    the reference's own row or a row without a speedup."""
    reference = report.reference.variant
    if row.speedup is None or not reference or row.variant == reference:
        return ""
    rows: list[BenchmarkRow] | list[ThroughputRow] = \
        report.throughput if isinstance(row, ThroughputRow) else report.benchmarks
    other = next((candidate for candidate in rows if candidate.variant == reference
                  and candidate.target == row.target and candidate.batch_size == row.batch_size), None)
    if other is None:
        return ""
    precisions = _precisions(report)
    return f"{_side(precisions.get(row.variant), row)} vs {_side(precisions.get(reference), other)}"


def _precisions(report: Report) -> dict[str, str]:
    """Variant -> its artifact's precision (fp32, fp16, int8), from the validation rows."""
    found: dict[str, str] = {}
    for row in report.validation:
        if row.precision:
            found.setdefault(row.variant, row.precision)
    return found


def attempts_line(row: ValidationRow) -> str:
    """'precision attempts: default (bf16) failed, cosine 0.97; f32 passed, cosine 1: ships with
    INFERENCE_PRECISION_HINT f32'; '' for a row with one attempt."""
    attempts = row.precision_attempts or []
    if not attempts:
        return ""
    parts = [f"{attempt.get('setting')} ({attempt.get('ran')}) {attempt.get('status')}, "
             f"{fmt_fidelity(attempt.get('metrics') or {})}" for attempt in attempts]
    shipped = row.deploy_precision
    tail = (f": ships with INFERENCE_PRECISION_HINT {shipped} pinned (runtime.json)" if shipped
            else ": no setting tried holds")
    return "precision attempts: " + "; ".join(parts) + tail


def settings_by_row(rows: list[BenchmarkRow]) -> tuple[dict[str, Any], dict[str, list[str]]]:
    """The settings every row of one target shares, and per differing key what each row used ('variant value')."""
    keys = list(dict.fromkeys(key for row in rows for key in (row.settings or {})))
    shared: dict[str, Any] = {}
    differing: dict[str, list[str]] = {}
    for key in keys:
        values = [(row.variant, (row.settings or {}).get(key)) for row in rows]
        if len({repr(value) for _, value in values}) == 1:
            shared[key] = values[0][1]
        else:
            differing[key] = list(dict.fromkeys(f"{variant} {value}" for variant, value in values))
    return shared, differing


_FLOAT32 = frozenset({"FP32", "FLOAT", "FLOAT32", "F32"})


def execution_record(precision: str | None, timed: BenchmarkRow | ThroughputRow | None,
                     checked: ValidationRow | None) -> ExecutionRecord | None:
    """What a deployer needs to reproduce one (variant, target): the artifact's precision, the precision that ran
    (from the timed row; the validation row where nothing was timed), the runtime and its providers or device,
    the kernel element types, and whether only float32 kernels ran for a reduced-precision artifact.  None for a
    row without an execution record."""
    timed = timed if isinstance(timed, BenchmarkRow) else None  # throughput rows keep no execution record
    row: Row | None = timed if timed is not None and timed.execution else checked
    execution = (row.execution if row is not None else None) or {}
    if row is None or not execution:
        return None
    kernels = {str(kind).upper(): count for kind, count in (execution.get("precisions") or {}).items()}
    record = ExecutionRecord(
        precision=precision, ran=ran_label(row), runtime=execution.get("runtime"),
        providers=list(execution.get("providers") or []), kernels=kernels,
        float32_only=bool(kernels) and set(kernels) <= _FLOAT32 and precision not in (None, "fp32"))
    if execution.get("runtime") == "onnxruntime" and len(execution.get("node_counts") or {}) > 1:
        record = record.replace(provider_kernels=dict(execution["node_counts"]))  # a fallback: kernels per provider
    if timed is not None and checked is not None and checked.execution and timed is row \
            and not same_setting(timed, checked):
        record = record.replace(validated=ran_label(checked))  # a pin validation ships that this benchmark did not time
    return record


def execution_phrase(record: ExecutionRecord | None) -> str:
    """'fp16 artifact, but onnxruntime ran all 8 of its kernels in float32 on CPUExecutionProvider', 'int8
    artifact, float parts at bf16 (device default), OpenVINO CPU'; '' for no record."""
    if record is None:
        return ""
    precision = record.precision or "?"
    kernels = record.kernels
    where = _providers(record)
    runtime = record.runtime
    if runtime == "onnxruntime":
        if record.float32_only:
            text = (f"{precision} artifact, but onnxruntime ran all {sum(kernels.values())} of its kernels in "
                    f"float32 on {where}: its numbers are float32 arithmetic's, not {precision}'s")
        else:
            mix = " + ".join(f"{count} {kind.lower()}" for kind, count in
                             sorted(kernels.items(), key=lambda item: -item[1]))
            text = f"{precision} artifact, onnxruntime ran {mix or 'its'} kernels on {where}"
    elif runtime == "openvino":
        part = " with float parts" if precision not in ("fp32", "fp16", "bf16", "?") else ""
        text = f"{precision} artifact{part} at {record.ran} on OpenVINO {where}"
    else:
        text = f"{precision} artifact, {record.ran} ({runtime or where})"
    return text + (f"; validated at {record.validated}" if record.validated else "")


def _providers(record: ExecutionRecord) -> str:
    if record.provider_kernels:
        return " + ".join(f"{name} ({count} kernels)" for name, count in record.provider_kernels.items())
    return ", ".join(record.providers) or "its default device"
