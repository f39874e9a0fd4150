"""The ``layers`` section of report.json as its readers read it (``qdeploy explain``, report.md, report.html).

report.json is a file a user may edit, and nothing signs it: a reader validates what it reads.  These models check
every field the readers use, with its type; a field they do not use is let through (``extra="allow"``), so a
report written with more keys still reads.  ``check_layers_section`` turns a section that does not fit into an
input error naming report.json and the field (exit 2), never an AttributeError or a TypeError inside a renderer.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from qdeploy.core.errors import QdeployInputError

__all__ = ["LayerPair", "LayerRow", "LayersSection", "check_layers_section"]


class _Read(BaseModel):
    """Fields readers use are typed; the others pass (a newer writer may add some)."""

    model_config = ConfigDict(extra="allow")


class LayerRow(_Read):
    """One executed layer: what ran, in which precision, how long, its error against the reference."""

    layer: str
    op: str
    precision: str
    exec: str = ""
    time_ms: float | None = None
    macs: int | None = None
    snr_db: float | None = None
    snr_drop_db: float | None = None
    cosine: float | None = None
    nonfinite: int | None = None
    nonfinite_born: bool = False
    decision: str | None = None
    float_reason: str | None = None
    nodes: list[str] = Field(default_factory=list)


class PairSummary(_Read):
    lines: list[str]
    time_ms: float


class PairProfile(_Read):
    profiled_ms: float | None = None
    runs: int | None = None
    benchmark_p50_ms: float | None = None


class PairExposure(_Read):
    note: str
    changed: bool = False


class Timeline(_Read):
    layer: list[str]
    time_ms: list[float]
    precision: list[str]
    snr_db: list[float | None]


class LayerPair(_Read):
    """One profiled (variant, target): its summary and rows when ``status`` is ok, else why it was not profiled."""

    variant: str
    target: str
    why: str
    status: str
    reason: str | None = None
    seconds: float = 0.0
    summary: PairSummary | None = None
    profile: PairProfile | None = None
    exposure: PairExposure | None = None
    top_time: list[LayerRow] | None = None
    top_error: list[LayerRow] | None = None
    rows: list[LayerRow] | None = None
    rows_total: int | None = None
    timeline: Timeline | None = None
    unclaimed_nodes: list[str] = Field(default_factory=list)

    @model_validator(mode="after")
    def _profiled_pairs_are_whole(self) -> LayerPair:
        if self.status == "ok":
            missing = [name for name in ("summary", "exposure", "top_time", "top_error", "rows_total", "timeline")
                       if getattr(self, name) is None]
            if missing:
                raise ValueError(f"a profiled pair (status ok) needs {', '.join(missing)}")
        return self


class LayersSection(_Read):
    mode: str
    seconds: float = 0.0
    reason: str | None = None
    top: int | None = None
    pairs: list[LayerPair] = Field(default_factory=list)


class _Named(_Read):
    name: str


class _Targeted(_Read):
    target: str


class _Explained(_Read):
    """What ``qdeploy explain`` reads of a report beside its layers section: the run's names and its time."""

    seconds: float | None = None
    artifacts: list[_Named] = Field(default_factory=list)
    validation: list[_Targeted] = Field(default_factory=list)
    layers: LayersSection | None = None


def check_layers_section(report: dict[str, Any], file: object) -> None:
    """QdeployInputError (exit 2) naming ``file`` and the field when report.json's ``layers`` section, or what
    explain reads beside it (``seconds``, artifact names, validation targets), is not shaped as qdeploy writes it."""
    try:
        _Explained.model_validate(report)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "the report"
        more = len(exc.errors()) - 1
        also = f" (and {more} more problem{'s' if more > 1 else ''})" if more else ""
        raise QdeployInputError(f"{file}: field '{where}': {first['msg'].removeprefix('Value error, ')}{also}; "
                                "report.json is not as qdeploy writes it (was it edited?): run the recipe again "
                                "to rewrite it") from None
