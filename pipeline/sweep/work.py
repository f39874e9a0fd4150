"""Work items of a sweep and the code that runs them in a worker (a process of this machine or a Ray task).

A recipe of a sweep is four kinds of work, in order: ``build`` (export and transforms), ``validate``,
``benchmark`` and ``report``.  Each runs one phase of ``qdeploy.pipeline.run.runner`` and returns a ``WorkReply``: the
phase's value or the reason it failed, and the item's timeline entry (kind, recipe, start, end, node, pid).
Nothing here raises for a failure of the work itself: a failed recipe must never stop the sweep.

On one machine, ``machine_lock`` keeps benchmarks alone: every other kind holds a shared lock, a benchmark an
exclusive one, and a turnstile lock in front gives a waiting benchmark priority over new shared work.
"""

from __future__ import annotations

import fcntl
import logging
import os
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypedDict, TypeVar

from qdeploy.core.errors import QdeployError, QdeployInputError, StageError
from qdeploy.core.files import shared_temp_dir
from qdeploy.core.rows import BenchmarkRow, ThroughputRow, ValidationRow
from qdeploy.core.runtimes import phase_order

_Row = TypeVar("_Row", ValidationRow, BenchmarkRow | ThroughputRow)

__all__ = ["KINDS", "WorkItem", "WorkKind", "WorkRecord", "WorkReply", "default_lock_path", "execute", "machine_lock",
           "merge_rows"]

log = logging.getLogger(__name__)

WorkKind = Literal["build", "validate", "benchmark", "report"]
KINDS: tuple[WorkKind, ...] = ("build", "validate", "benchmark", "report")


@dataclass(frozen=True)
class WorkItem:
    """One unit of work of one recipe; evaluation items may cover part of the recipe's targets."""

    kind: WorkKind
    recipe: str
    targets: tuple[str, ...] | None = None
    """Targets of a validate or benchmark item; None for all the recipe's (selected) targets."""
    attempt: int = 1


class WorkRecord(TypedDict, total=False):
    """An item's timeline entry (empty until the item was timed): what ran, when, where, whether it ran."""

    kind: WorkKind
    recipe: str
    targets: list[str]
    start: float
    end: float
    node: str
    pid: int
    ok: bool


@dataclass
class WorkReply:
    """What a worker sends back: the phase's value or why it failed, and the timeline entry."""

    value: Any = None
    error: str | None = None
    input_error: bool = False
    record: WorkRecord = field(default_factory=WorkRecord)


def default_lock_path() -> Path:
    """This machine's benchmark lock: one per user, shared by every sweep of that user."""
    return shared_temp_dir() / f"qdeploy-{os.getuid()}.work.lock"


@contextmanager
def machine_lock(path: Path, *, exclusive: bool) -> Iterator[None]:
    """Shared (other work) or exclusive (a benchmark) hold of this machine, across processes.

    A waiting exclusive holder takes the turnstile first, so new shared holders queue behind it instead of
    starving it; flock locks vanish with their process, so a killed worker never leaves the machine held.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    turnstile_path = path.with_name(path.name + ".turnstile")
    with turnstile_path.open("a") as turnstile, path.open("a") as lock:
        fcntl.flock(turnstile, fcntl.LOCK_EX)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        finally:
            fcntl.flock(turnstile, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def execute(item: WorkItem, payload: tuple[Any, ...], lock_path: Path | None, node: str | None = None) -> WorkReply:
    """Run one item (under the machine lock when given); never raises for the work's own failure."""
    if lock_path is None:
        return _timed(item, payload, node)
    with machine_lock(lock_path, exclusive=item.kind == "benchmark"):
        return _timed(item, payload, node)


def _timed(item: WorkItem, payload: tuple[Any, ...], node: str | None) -> WorkReply:
    start = time.time()
    reply = _run_phase(item, payload)
    reply.record = {"kind": item.kind, "recipe": item.recipe, "targets": list(item.targets or []),
                    "start": start, "end": time.time(), "node": node or socket.gethostname(), "pid": os.getpid(),
                    "ok": reply.error is None}
    return reply


def _run_phase(item: WorkItem, payload: tuple[Any, ...]) -> WorkReply:
    # lazy: pulls onnxruntime (import cost)
    from qdeploy.pipeline.run import runner

    targets = list(item.targets) if item.targets is not None else None
    try:
        if item.kind == "build":
            return WorkReply(value=runner.build_phase(*payload))
        if item.kind == "validate":
            return WorkReply(value=runner.validate_phase(*payload, targets=targets))
        if item.kind == "benchmark":
            plan, outcome, validation = payload
            return WorkReply(value=runner.benchmark_phase(plan, outcome, targets=targets, validation=validation))
        plan, outcome, validation, benchmarks, seconds = payload
        return WorkReply(value=runner.finish_run(plan, outcome, validation, benchmarks, seconds=seconds))
    except QdeployError as exc:
        reason = exc.reason if isinstance(exc, StageError) else str(exc)
        log.error("recipe %s: %s failed: %s", item.recipe, item.kind, reason)
        return WorkReply(error=reason, input_error=isinstance(exc, QdeployInputError))
    except Exception as exc:  # a bug or a library failing on one recipe must not lose the sweep
        log.debug("recipe %s: %s failed", item.recipe, item.kind, exc_info=True)
        return WorkReply(error=f"{type(exc).__name__}: {exc}")


def merge_rows(parts: list[list[_Row]], variants: list[str], targets: list[str], batches: list[int]) -> list[_Row]:
    """Rows of evaluation items split by target, in the order one whole phase gives them.

    Validation rows come per variant, then target; benchmark rows per target, then batch, then variant
    (``qdeploy.core.runtimes.phase_order``).
    """
    return phase_order([row for part in parts for row in part], variants, targets, batches)
