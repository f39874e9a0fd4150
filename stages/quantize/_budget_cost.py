"""What the accuracy budget spends, and the bound on it: evaluations and seconds per phase, and
``budget.max_seconds``.

``Clock`` counts each phase's evaluations and seconds (ranking, prefix, re-quantize, confirmation on the
held-back samples, targets, latency) for the sidecar's ``cost``.  With ``max_seconds``, ``check`` raises
``OutOfTime`` before an evaluation starts past the limit: the search then writes the best model it has measured
so far (the fewest float nodes that held on the search samples, else the one closest to the tolerance), one
more evaluation measures it on the held-back samples and each target confirms it, and the findings say where
it stopped (``stopped``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any


class OutOfTime(Exception):
    """``budget.max_seconds`` has passed: the search stops with what it has."""


@dataclass
class Clock:
    """The budget's time: when it started, its limit, and each phase's evaluations and seconds."""

    max_seconds: float | None = None
    started: float = field(default_factory=time.perf_counter)
    phases: dict[str, dict[str, float]] = field(default_factory=dict)
    stopped: str | None = None
    """Where ``max_seconds`` stopped the search; None when it ran to its end."""
    counter: Callable[[], int] = lambda: 0
    """Evaluations made so far on every runtime: a phase counts what it added."""

    def elapsed(self) -> float:
        return time.perf_counter() - self.started

    def check(self, phase: str) -> None:
        """Raise ``OutOfTime`` (and remember where) when the limit has passed."""
        if self.max_seconds is not None and self.elapsed() > self.max_seconds:
            if self.stopped is None:
                self.stopped = (f"budget.max_seconds ({self.max_seconds:g} s) reached after "
                                f"{self.elapsed():.1f} s, before {phase}: the best model found so far is written")
            raise OutOfTime(self.stopped)

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Count the evaluations and the seconds of the block under ``name``."""
        begun, before = time.perf_counter(), self.counter()
        try:
            yield
        finally:
            entry = self.phases.setdefault(name, {"evaluations": 0, "seconds": 0.0})
            entry["evaluations"] += self.counter() - before
            entry["seconds"] += time.perf_counter() - begun

    def report(self) -> dict[str, dict[str, Any]]:
        return {name: {"evaluations": int(entry["evaluations"]), "seconds": round(entry["seconds"], 3)}
                for name, entry in self.phases.items()}
