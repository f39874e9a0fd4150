"""What the accuracy budget spends, and the bound on it: evaluations and seconds per phase, and its time bound.

``Clock`` counts each phase's evaluations and seconds (ranking, prefix, re-quantize, confirmation on the
held-back samples, targets, latency) for the sidecar's ``cost``.  Every budget has a time bound: ``max_seconds``
when the recipe sets ``budget.max_seconds``, else a default that scales with the model, set after the first full
evaluation (``bound_from``): ``DEFAULT_EVALUATIONS`` times its seconds, within ``DEFAULT_FLOOR_SECONDS`` and
``DEFAULT_CEILING_SECONDS``.  ``check`` raises ``OutOfTime`` before an evaluation starts past the bound: the
search then writes the best model it has measured so far (the fewest float nodes that held on the search samples,
else the one closest to the tolerance), one more evaluation measures it on the held-back samples and each target
confirms it, and the findings say where it stopped (``stopped``) and which bound stopped it (``time_bound``).

Time is read through ``now`` (tests replace it with a fake clock).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from qdeploy.stages.accuracy_budget.findings import PhaseCost, TimeBound

__all__ = ["DEFAULT_CEILING_SECONDS", "DEFAULT_EVALUATIONS", "DEFAULT_FLOOR_SECONDS", "Clock", "OutOfTime", "now"]

DEFAULT_EVALUATIONS = 60
"""A budget without ``max_seconds`` stops after this many full evaluations' worth of seconds: the searches measured
on real models spent 15 to 58 evaluations (docs/quantize-budget.md), most of them on fewer samples than a full one.
Counted in seconds of the model's own evaluation, the bound is the same on a quiet machine and a loaded one."""
DEFAULT_FLOOR_SECONDS = 120.0
"""The default bound is never below this: a small model's search is never cut for seconds that do not matter."""
DEFAULT_CEILING_SECONDS = 1800.0
"""Nor above this: a search on a large model, or on a machine other jobs share, ends within half an hour."""


def now() -> float:
    """The budget's clock (seconds)."""
    return time.perf_counter()


class OutOfTime(Exception):
    """The budget's time bound has passed: the search stops with what it has."""


@dataclass
class Clock:
    """The budget's time: when it started, its bound, and each phase's evaluations and seconds."""

    max_seconds: float | None = None
    """``budget.max_seconds``; None: the default bound applies from the first full evaluation on."""
    started: float = field(default_factory=lambda: now())
    phases: dict[str, dict[str, float]] = field(default_factory=dict)
    stopped: str | None = None
    """Where the bound stopped the search; None when it ran to its end."""
    counter: Callable[[], int] = lambda: 0
    """Evaluations made so far on every runtime: a phase counts what it added."""
    bound: float | None = None
    """The bound in force (seconds since ``started``): ``max_seconds``, or the default once ``bound_from`` set it."""
    first_evaluation: float | None = None

    def __post_init__(self) -> None:
        self.bound = self.max_seconds

    def elapsed(self) -> float:
        return now() - self.started

    def seconds_left(self) -> float | None:
        """Seconds until the bound in force; None when none is set yet."""
        return None if self.bound is None else self.bound - self.elapsed()

    def bound_from(self, first_evaluation: float) -> None:
        """Set the default bound from the seconds of the first full evaluation, unless ``max_seconds`` is set."""
        self.first_evaluation = first_evaluation
        if self.max_seconds is None:
            self.bound = min(max(DEFAULT_EVALUATIONS * first_evaluation, DEFAULT_FLOOR_SECONDS),
                             DEFAULT_CEILING_SECONDS)

    def check(self, phase: str) -> None:
        """Raise ``OutOfTime`` (and remember where) when the bound has passed."""
        if self.bound is not None and self.elapsed() > self.bound:
            if self.stopped is None:
                self.stopped = (f"{self._bound_name()} reached after {self.elapsed():.1f} s, before {phase}: "
                                "the best model found so far is written")
            raise OutOfTime(self.stopped)

    def time_bound(self) -> TimeBound | None:
        """What bounded the search, for the findings: the seconds, who set them, and how."""
        if self.bound is None:
            return None
        record = TimeBound(seconds=round(self.bound, 3),
                           set_by="budget.max_seconds" if self.max_seconds is not None else "default")
        if self.first_evaluation is not None:
            record.first_evaluation_seconds = round(self.first_evaluation, 3)
        if self.max_seconds is None:
            record.rule = (f"{DEFAULT_EVALUATIONS} x the first full evaluation's seconds, at least "
                           f"{DEFAULT_FLOOR_SECONDS:g} s, at most {DEFAULT_CEILING_SECONDS:g} s; "
                           "budget.max_seconds sets another")
        return record

    def _bound_name(self) -> str:
        if self.max_seconds is not None:
            return f"budget.max_seconds ({self.max_seconds:g} s)"
        assert self.bound is not None and self.first_evaluation is not None
        return (f"the budget's default time bound ({self.bound:g} s: {DEFAULT_EVALUATIONS} x the "
                f"{self.first_evaluation:.3g} s of its first full evaluation, within {DEFAULT_FLOOR_SECONDS:g}-"
                f"{DEFAULT_CEILING_SECONDS:g} s; set budget.max_seconds to change it)")

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Count the evaluations and the seconds of the block under ``name``."""
        begun, before = now(), self.counter()
        try:
            yield
        finally:
            entry = self.phases.setdefault(name, {"evaluations": 0, "seconds": 0.0})
            entry["evaluations"] += self.counter() - before
            entry["seconds"] += now() - begun

    def report(self) -> dict[str, PhaseCost]:
        return {name: PhaseCost(evaluations=int(entry["evaluations"]), seconds=round(entry["seconds"], 3))
                for name, entry in self.phases.items()}
