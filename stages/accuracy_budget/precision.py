"""Execution precision as a deployment setting: the one fallback from a device default that misses to a pinned
INFERENCE_PRECISION_HINT that holds.

On CPUs with AVX512-BF16 or AMX, OpenVINO runs the float parts of fp16 and int8 artifacts in bfloat16 unless
INFERENCE_PRECISION_HINT says otherwise.  When the default ran below float32 and missed the tolerance, the same
artifact is tried pinned to each hint ``qdeploy.targets.cpu_facts.pins_after`` offers (f16 where the device has
it, then f32); the first that passes and really ran at that precision (OpenVINO ignores a hint the machine
cannot run) is the setting to ship.  Validation (``qdeploy.stages.validate``) and the accuracy budget's
per-target confirmation (``targets``) both decide through ``pinned_fallback``: what the budget confirms is what
validation will ship.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from qdeploy.targets.cpu_facts import pins_after, short_precision

__all__ = ["PinAttempt", "PinnedFallback", "pinned_fallback"]

T = TypeVar("T")


@dataclass(frozen=True)
class PinAttempt(Generic[T]):
    """One pinned run: the hint asked, whether it passed, the precision that really ran, the caller's result."""

    hint: str
    passed: bool
    ran: str | None
    """Short form ('f32', 'bf16', 'f16'); None when the runtime did not say."""
    result: T

    @property
    def holds(self) -> bool:
        """Passed, at the precision pinned (not at another one the machine fell back to)."""
        return self.passed and self.ran == self.hint


@dataclass(frozen=True)
class PinnedFallback(Generic[T]):
    """Every pinned attempt in order; the last one holds when any does."""

    attempts: list[PinAttempt[T]]

    @property
    def held(self) -> PinAttempt[T] | None:
        """The pinned setting that holds, or None."""
        return self.attempts[-1] if self.attempts and self.attempts[-1].holds else None


def pinned_fallback(target: str, default_ran: object,
                    attempt: Callable[[str], tuple[bool, object, T]]) -> PinnedFallback[T]:
    """Try ``target`` pinned to each hint worth trying after its default ran ``default_ran`` and missed, until one
    holds; ``attempt(hint)`` runs and compares the artifact pinned, returning (passed, precision that ran, its
    own result).  No attempt for other runtimes or a default that already ran in f32."""
    attempts: list[PinAttempt[T]] = []
    for hint in pins_after(target, default_ran):
        passed, ran, result = attempt(hint)
        attempts.append(PinAttempt(hint, passed, short_precision(ran), result))
        if attempts[-1].holds:
            break
    return PinnedFallback(attempts)
