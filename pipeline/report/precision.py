"""Which precision each row really ran, said per row from that row's own record (never copied from another row).

OpenVINO rows carry the INFERENCE_PRECISION_HINT their numbers ran with (``precision_hint``: None for the device
default) and the precision OpenVINO compiled (``execution['precision']``, read back); a validation row whose
default missed and whose pinned setting held carries ``deploy_precision`` and its ``precision_attempts``.  ONNX
Runtime rows carry the element types of their kernels; reference rows run every op in its declared type.
"""

from __future__ import annotations

from typing import Any

from qdeploy.pipeline.report.format import fmt_fidelity

__all__ = ["attempts_line", "execution_phrase", "execution_record", "ran_label", "ran_short", "same_setting",
           "settings_by_row", "speedup_sides"]

_SHORT = {"float32": "f32", "f32": "f32", "bfloat16": "bf16", "bf16": "bf16", "float16": "f16", "f16": "f16"}


def ran_short(row: dict[str, Any]) -> str | None:
    """The inference precision OpenVINO read back for the row ('f32', 'bf16', 'f16'), else None."""
    ran = (row.get("execution") or {}).get("precision")
    return _SHORT.get(str(ran), str(ran)) if ran and ran != "declared" else None


def ran_label(row: dict[str, Any]) -> str:
    """What the row's numbers ran at: 'f32 (pinned)', 'bf16 (device default)', 'f32 (pinned; default bf16
    missed)', 'fp16+fp32 kernels', 'declared types'; '–' for a row that did not run."""
    execution = row.get("execution") or {}
    if not execution:
        return "–"
    if execution.get("runtime") == "openvino":
        ran = ran_short(row) or "unknown"
        if row.get("deploy_precision"):
            default = ((row.get("precision_attempts") or [{}])[0]).get("ran") or "default"
            return f"{ran} (pinned; default {default} missed)"
        if "precision_hint" not in row:  # a report written before rows said it: only what was read back
            return ran
        hint = row.get("precision_hint")
        if hint is None:
            return f"{ran} (device default)"
        return f"{ran} (pinned)" if hint == ran else f"{ran} ({hint} asked; the device ran {ran})"
    if execution.get("precision") == "declared":
        return "declared types"
    kinds = sorted(str(kind).lower() for kind in execution.get("precisions") or {})
    return f"{'+'.join(kinds)} kernels" if kinds else (row.get("precision") or "–")


def same_setting(first: dict[str, Any], second: dict[str, Any]) -> bool:
    """Two rows (a benchmark and a validation) ran the same precision with the same hint."""
    return ran_short(first) == ran_short(second) and first.get("precision_hint") == second.get("precision_hint")


def _side(precision: str | None, row: dict[str, Any]) -> str:
    ran = ran_short(row)
    if precision is None:
        return ran or "?"
    if ran is None:
        return precision
    return f"{precision} ({ran} float parts)" if precision == "int8" else f"{precision} ({ran})"


def speedup_sides(report: dict[str, Any], row: dict[str, Any], key: str = "benchmarks") -> str:
    """'int8 (bf16 float parts) vs fp32 (f32)': the precisions a speedup compares, each from its own row; '' for
    the reference's own row or a row without a speedup."""
    reference = (report.get("reference") or {}).get("variant")
    if row.get("speedup") is None or not reference or row.get("variant") == reference:
        return ""
    other = next((candidate for candidate in report.get(key) or [] if candidate.get("variant") == reference
                  and candidate.get("target") == row.get("target")
                  and candidate.get("batch_size") == row.get("batch_size")), None)
    if other is None:
        return ""
    precisions = _precisions(report)
    return (f"{_side(precisions.get(row['variant']), _with_execution(report, row))} vs "
            f"{_side(precisions.get(reference), _with_execution(report, other))}")


def _with_execution(report: dict[str, Any], row: dict[str, Any]) -> dict[str, Any]:
    """Throughput rows read back their hint into ``settings``, not ``execution``: give them one for ``_side``."""
    if row.get("execution"):
        return row
    hint = (row.get("settings") or {}).get("INFERENCE_PRECISION_HINT")
    return {**row, "execution": {"runtime": "openvino", "precision": hint}} if hint else row


def _precisions(report: dict[str, Any]) -> dict[str, str]:
    """Variant -> its artifact's precision (fp32, fp16, int8), from the validation rows."""
    found: dict[str, str] = {}
    for row in report.get("validation") or []:
        if row.get("precision"):
            found.setdefault(row["variant"], row["precision"])
    return found


def attempts_line(row: dict[str, Any]) -> str:
    """'precision attempts: default (bf16) failed, cosine 0.97; f32 passed, cosine 1: ships with
    INFERENCE_PRECISION_HINT f32'; '' for a row with one attempt."""
    attempts = row.get("precision_attempts") or []
    if not attempts:
        return ""
    parts = [f"{attempt.get('setting')} ({attempt.get('ran')}) {attempt.get('status')}, "
             f"{fmt_fidelity(attempt.get('metrics') or {})}" for attempt in attempts]
    shipped = row.get("deploy_precision")
    tail = (f": ships with INFERENCE_PRECISION_HINT {shipped} pinned (runtime.json)" if shipped
            else ": no setting tried holds")
    return "precision attempts: " + "; ".join(parts) + tail


def settings_by_row(rows: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, list[str]]]:
    """The settings every row of one target shares, and per differing key what each row used ('variant value')."""
    keys = list(dict.fromkeys(key for row in rows for key in (row.get("settings") or {})))
    shared: dict[str, Any] = {}
    differing: dict[str, list[str]] = {}
    for key in keys:
        values = [(row["variant"], (row.get("settings") or {}).get(key)) for row in rows]
        if len({repr(value) for _, value in values}) == 1:
            shared[key] = values[0][1]
        else:
            differing[key] = list(dict.fromkeys(f"{variant} {value}" for variant, value in values))
    return shared, differing


_FLOAT32 = frozenset({"FP32", "FLOAT", "FLOAT32", "F32"})


def execution_record(precision: str | None, timed: dict[str, Any] | None,
                     checked: dict[str, Any] | None) -> dict[str, Any]:
    """What a deployer needs to reproduce one (variant, target): the artifact's precision, the precision that ran
    (from the timed row; the validation row where nothing was timed), the runtime and its providers or device,
    the kernel element types, and whether only float32 kernels ran for a reduced-precision artifact.  {} for a
    row without an execution record."""
    row = timed if timed and timed.get("execution") else checked
    execution = (row or {}).get("execution") or {}
    if not execution:
        return {}
    kernels = {str(kind).upper(): count for kind, count in (execution.get("precisions") or {}).items()}
    record: dict[str, Any] = {
        "precision": precision, "ran": ran_label(row or {}), "runtime": execution.get("runtime"),
        "providers": list(execution.get("providers") or []), "kernels": kernels,
        "float32_only": bool(kernels) and set(kernels) <= _FLOAT32 and precision not in (None, "fp32")}
    if execution.get("runtime") == "onnxruntime" and len(execution.get("node_counts") or {}) > 1:
        record["provider_kernels"] = dict(execution["node_counts"])  # a fallback: kernels per provider
    if timed and checked and checked.get("execution") and timed is row and not same_setting(timed, checked):
        record["validated"] = ran_label(checked)  # a pin validation ships that this benchmark did not time
    return record


def execution_phrase(record: dict[str, Any]) -> str:
    """'fp16 artifact, but onnxruntime ran all 8 of its kernels in float32 on CPUExecutionProvider', 'int8
    artifact, float parts at bf16 (device default), OpenVINO CPU'; '' for an empty record."""
    if not record:
        return ""
    precision = record.get("precision") or "?"
    kernels: dict[str, int] = record.get("kernels") or {}
    where = _providers(record)
    runtime = record.get("runtime")
    if runtime == "onnxruntime":
        if record.get("float32_only"):
            text = (f"{precision} artifact, but onnxruntime ran all {sum(kernels.values())} of its kernels in "
                    f"float32 on {where}: its numbers are float32 arithmetic's, not {precision}'s")
        else:
            mix = " + ".join(f"{count} {kind.lower()}" for kind, count in
                             sorted(kernels.items(), key=lambda item: -item[1]))
            text = f"{precision} artifact, onnxruntime ran {mix or 'its'} kernels on {where}"
    elif runtime == "openvino":
        part = " with float parts" if precision not in ("fp32", "fp16", "bf16", "?") else ""
        text = f"{precision} artifact{part} at {record.get('ran')} on OpenVINO {where}"
    else:
        text = f"{precision} artifact, {record.get('ran')} ({runtime or where})"
    return text + (f"; validated at {record['validated']}" if record.get("validated") else "")


def _providers(record: dict[str, Any]) -> str:
    split = record.get("provider_kernels")
    if split:
        return " + ".join(f"{name} ({count} kernels)" for name, count in split.items())
    return ", ".join(record.get("providers") or []) or "its default device"
