"""sweep.json as one typed model: built once by ``qdeploy.pipeline.sweep.report.build_sweep_report``, written with
``to_json()`` (the keys sweep.json has always had), read by the sweep's renderers and ``qdeploy sweep`` through
attributes.  Each recipe's own report.json is ``qdeploy.core.report.Report``."""

from __future__ import annotations

from typing import Any, ClassVar, TypedDict

from pydantic import BaseModel, ConfigDict, Field

from qdeploy.core.rows import ResultRow

__all__ = ["ExecutorDescription", "ExecutorNode", "ExecutorRecord", "FailureEntry", "GateCounts", "RecipeRow",
           "SweepMatrixRow", "SweepReport", "TimelineRecord", "UnavailableEntry", "VerdictEntry"]


class GateCounts(ResultRow):
    passed: int
    failed: int
    skipped: int


class RecipeRow(ResultRow):
    """One recipe of the sweep: its status and exit code, its folder and reports, its time and its gates."""

    name: str
    origin: str
    status: str
    reason: str | None
    exit_code: int
    folder: str
    reports: dict[str, str] = Field(default_factory=dict)
    """Format ('json', 'md', 'html') -> the recipe's report, relative to the sweep's folder."""
    seconds: float | None
    gates: GateCounts


class VerdictEntry(ResultRow):
    """A recipe's verdict on one target, in words (``qdeploy.pipeline.report.verdict_words``)."""

    recipe: str
    target: str
    status: str
    variant: str | None
    why: str
    ran: str
    numbers: str
    package: str


class UnavailableEntry(ResultRow):
    target: str
    reason: str
    recipes: list[str] = Field(default_factory=list)


class SweepMatrixRow(ResultRow):
    """One recipe, variant and available target (or one row saying why a recipe did not finish)."""

    recipe: str
    variant: str | None
    target: str | None
    status: str | None
    reason: str | None
    cosine: float | None
    benchmark: str | None
    batch_size: int | None
    p50_ms: float | None
    speedup: float | None
    gates: str | None


class FailureEntry(ResultRow):
    recipe: str
    variant: str | None
    stage: str | None
    status: str
    reason: str | None


class TimelineRecord(ResultRow):
    """One work item: its kind, recipe and targets, seconds from the sweep's start, where it ran, whether it ran."""

    OPTIONAL: ClassVar[frozenset[str]] = frozenset({"targets", "ok"})

    kind: str
    recipe: str
    targets: list[str] | None = None
    start: float
    end: float
    node: str
    pid: int
    ok: bool | None = None


class ExecutorNode(TypedDict, total=False):
    """A machine an executor runs on: local (node, cpus) or a Ray node (also ip, gpus, the targets it serves)."""

    node: str
    ip: str
    cpus: int
    gpus: int
    targets: list[str]


class ExecutorDescription(TypedDict, total=False):
    """``executor.describe()``, as sweep.json's ``executor`` records it (``ExecutorRecord``)."""

    kind: str
    workers: int
    lock: str
    address: str
    nodes: list[ExecutorNode]


class ExecutorRecord(BaseModel):
    """``executor.describe()``: its kind, and what each executor says of itself (workers, nodes, address)."""

    model_config = ConfigDict(extra="allow", frozen=True)

    kind: str


class SweepReport(ResultRow):
    """The sweep's report (sweep.json)."""

    schema_version: int
    sweep: str
    created: str
    started_at: float
    seconds: float
    executor: ExecutorRecord
    exit_code: int
    passed: bool
    counts: dict[str, int]
    """Recipes per status ('passed', 'failed', 'invalid', 'error') and in all ('recipes')."""
    recipes: list[RecipeRow] = Field(default_factory=list)
    verdicts: list[VerdictEntry] = Field(default_factory=list)
    unavailable: list[UnavailableEntry] = Field(default_factory=list)
    rows: list[SweepMatrixRow] = Field(default_factory=list)
    failures: list[FailureEntry] = Field(default_factory=list)
    timeline: list[TimelineRecord] = Field(default_factory=list)

    @classmethod
    def of(cls, report: SweepReport | dict[str, Any]) -> SweepReport:
        return report if isinstance(report, SweepReport) else cls.model_validate(report)
