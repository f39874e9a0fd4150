"""Execution precision as a validated deployment setting (OpenVINO).

On CPUs with AVX512-BF16 or AMX, OpenVINO runs the float parts of fp16 and int8 artifacts in bfloat16 unless
INFERENCE_PRECISION_HINT says otherwise.  Validation first measures that default, as a user who changes nothing
gets it.  When the default runs below float32 and misses the tolerance, the same artifact is tried pinned to f16
(where the device has it: 11 significant bits to bfloat16's 8, and faster than f32) and then to f32.  The first
pinned setting that holds becomes the row's deployment setting (``deploy_precision``): the row's numbers are that
run's, the package pins INFERENCE_PRECISION_HINT to it, and ``precision_attempts`` keeps every attempt, the
failing default first, so nothing pretends the default passed.

``$QDEPLOY_CPU_FLAGS`` describes another CPU (``qdeploy.targets.cpu_facts``): the default attempt then asks
OpenVINO for that CPU's default explicitly.  OpenVINO ignores a hint the machine cannot run (a bf16 hint on an
AVX2 CPU compiles in f32); the row then records the precision that really ran, and the note says so.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TypedDict

from qdeploy.core.rows import ValidationRow
from qdeploy.stages.accuracy_budget.precision import pinned_fallback
from qdeploy.stages.validate._common import Outcome
from qdeploy.targets.base import ExecutionInfoDict
from qdeploy.targets.cpu_facts import default_hint, pins_after, short_precision

__all__ = ["PINNED_F32_NOTE", "REDUCED_ARTIFACTS", "PrecisionAttempt", "attempt_record", "default_attempt_hint",
           "device_default_basis", "pinned_candidates", "read_back_precision", "with_pinned_fallback"]

log = logging.getLogger(__name__)

REDUCED_ARTIFACTS = ("fp16", "int8", "int4")
"""Artifacts OpenVINO runs at the device default (float32 artifacts are always pinned to f32)."""

PINNED_F32_NOTE = ("weight-only artifact run with INFERENCE_PRECISION_HINT f32 pinned, its activations in float32 as "
                   "the file declares them: the setting its package pins if the verdict ships this row")

Attempt = Callable[[str], Outcome]
"""Runs and compares the artifact pinned to one INFERENCE_PRECISION_HINT."""


class PrecisionAttempt(TypedDict):
    """One setting tried (a row's ``precision_attempts[]``): 'default' or the pinned hint, what ran, its verdict."""

    setting: str
    ran: str | None
    status: str
    passed: bool
    metrics: dict[str, float | int | None]
    reason: str
    tolerance: dict[str, float | str] | None


def read_back_precision(executed: ExecutionInfoDict | None) -> str | None:
    """The inference precision OpenVINO read back ('f32', 'bf16', 'f16'), or None when unknown."""
    return short_precision((executed or {}).get("precision"))


def _applies(target: str, precision: str) -> bool:
    return target.startswith("openvino:") and precision in REDUCED_ARTIFACTS


def default_attempt_hint(target: str, precision: str, *, device_default: bool = False) -> tuple[str | None, str]:
    """The hint of the default attempt and a note (``qdeploy.targets.cpu_facts.default_hint``); float32 artifacts
    (but the reference's device-default row) and other runtimes have none."""
    applies = _applies(target, precision) or (device_default and target.startswith("openvino:"))
    return default_hint(target) if applies else (None, "")


_DEFAULT_BASES = {"bf16": "bf16", "f16": "fp16"}
DEVICE_DEFAULT_BASIS = ("held to the {basis} default tolerance: the float32 model as {target} runs it by default "
                        "({ran}), what deploying it without quantizing gives")


def device_default_basis(target: str, executed: ExecutionInfoDict | None) -> tuple[str, str]:
    """The precision whose default tolerance the device-default row is held to (what really ran: bf16, f16, else
    fp32), and the row's note saying so."""
    ran = read_back_precision(executed) or "f32"
    basis = _DEFAULT_BASES.get(ran, "fp32")
    return basis, DEVICE_DEFAULT_BASIS.format(basis=basis, target=target, ran=ran)


def pinned_candidates(target: str, executed: ExecutionInfoDict | None) -> list[str]:
    """Pinned precisions worth trying after the default ran as ``executed`` says
    (``qdeploy.targets.cpu_facts.pins_after``)."""
    return pins_after(target, (executed or {}).get("precision"))


def attempt_record(setting: str, row: ValidationRow) -> PrecisionAttempt:
    """One attempt as the row keeps it: the setting ('default' or the pinned hint), what ran, its verdict."""
    return {"setting": setting, "ran": read_back_precision(row.execution), "status": row.status,
            "passed": row.status == "passed", "metrics": row.metrics.to_json(), "reason": row.reason,
            "tolerance": row.tolerance}


def with_pinned_fallback(first: Outcome, target: str, precision: str, attempt: Attempt) -> Outcome:
    """``first`` (the default) when it passed or cannot be helped by a pin; else the first pinned setting that
    holds (the one fallback the accuracy budgets also confirm with: ``accuracy_budget.precision.pinned_fallback``),
    or ``first`` with every attempt recorded and the reason saying the pins missed too."""
    row = first.row
    if row.status != "failed" or row.execution is None or not _applies(target, precision):
        return first

    def pinned(hint: str) -> tuple[bool, object, Outcome]:
        outcome = attempt(hint)
        return outcome.row.status == "passed", (outcome.row.execution or {}).get("precision"), outcome

    fallback = pinned_fallback(target, row.execution.get("precision"), pinned)
    if not fallback.attempts:
        return first
    default_ran = read_back_precision(row.execution)
    records = [attempt_record("default", row), *(attempt_record(pin.hint, pin.result.row) for pin in fallback.attempts)]
    held = fallback.held
    if held is not None:
        note = (f"misses its tolerance at the device default ({default_ran}: {row.reason}); holds with "
                f"INFERENCE_PRECISION_HINT {held.hint} pinned, the setting shipped (precision_attempts lists both)")
        log.info("%s on %s: %s", row.variant, target, note)
        outcome = held.result
        outcome.row = outcome.row.replace(precision_attempts=records, deploy_precision=held.hint,
                                          warnings=[*outcome.row.warnings, note])
        return outcome
    tried = ", ".join(f"{record['setting']} ({record['ran']}): {record['status']}" for record in records[1:])
    first.row = row.replace(precision_attempts=records,
                            reason=f"{row.reason}; pinned precisions miss too: {tried}")
    return first
