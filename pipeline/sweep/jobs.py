"""A recipe of a sweep as it moves through its phases (what the executors drive and the sweep report reads)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from qdeploy.core.rows import BenchmarkRow, ThroughputRow, ValidationRow
from qdeploy.pipeline.run.runner import BuildOutcome, RunOutcome, RunPlan
from qdeploy.pipeline.sweep import SweepEntry

__all__ = ["Job", "JobStatus"]

JobStatus = Literal["pending", "running", "passed", "failed", "invalid", "error"]


@dataclass
class Job:
    """A recipe of the sweep as it moves through its phases."""

    entry: SweepEntry
    folder: Path
    plan: RunPlan | None = None
    status: JobStatus = "pending"
    reason: str | None = None
    outstanding: int = 0
    outcome: BuildOutcome | None = None
    validation: list[list[ValidationRow]] = field(default_factory=list)
    benchmarks: list[list[BenchmarkRow | ThroughputRow]] = field(default_factory=list)
    result: RunOutcome | None = None
    started: float | None = None
    last_node: str | None = None

    @property
    def finished(self) -> bool:
        return self.status not in ("pending", "running")
