"""report.json as one typed model: built once by the run (``qdeploy.pipeline.results.summary``), written with
``to_json()``, read back with ``Report.load`` (or ``model_validate_json``); every reader reads attributes.

The keys are report.json's, unchanged since ``schema_version`` 2: ``to_json()`` of a parsed report is the JSON it
was parsed from (rows keep absent keys absent, see ``qdeploy.core.rows``).  Reports from older qdeploy versions
read as they are: a section they lack (``throughput``, ``layers``, ``packages``, ``verdict``) is None or empty.
``report_schema()`` is the JSON schema of the file (``qdeploy schema --report``).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, ClassVar

from pydantic import Field, ValidationError

from qdeploy.core.errors import QdeployInputError
from qdeploy.core.layer_rows import LayersSection
from qdeploy.core.report_parts import (
    ArtifactRecord,
    Environment,
    ModelIdentity,
    NoiseFloor,
    Packages,
    RecipeRecord,
    Reference,
    VerdictSection,
)
from qdeploy.core.rows import (
    BenchmarkRow,
    BuildFailure,
    GateResult,
    ResultRow,
    ThroughputRow,
    UnmeasuredEntry,
    ValidationRow,
)

__all__ = ["REPORT_SCHEMA_VERSION", "Report", "as_report", "report_schema"]

REPORT_SCHEMA_VERSION = 2
"""2: `verdict` and `throughput` added."""


class Report(ResultRow):
    """A run's report.json."""

    OPTIONAL: ClassVar[frozenset[str]] = frozenset({
        "model", "environment", "noise_floor", "unreadable_targets", "throughput", "verdict", "packages", "layers",
        "unmeasured"})

    schema_version: int = REPORT_SCHEMA_VERSION
    recipe: RecipeRecord
    model: ModelIdentity | None = None
    created: str
    seconds: float
    environment: Environment | None = None
    reference: Reference
    passed: bool
    gates: list[GateResult] = Field(default_factory=list)
    failures: list[BuildFailure] = Field(default_factory=list)
    unmeasured: list[UnmeasuredEntry] = Field(default_factory=list)
    artifacts: list[ArtifactRecord] = Field(default_factory=list)
    validation: list[ValidationRow] = Field(default_factory=list)
    noise_floor: NoiseFloor | None = None
    unreadable_targets: dict[str, str] = Field(default_factory=dict)
    """Targets that cannot read the original model -> why (said once; their rows are ``unreadable``)."""
    benchmarks: list[BenchmarkRow] = Field(default_factory=list)
    throughput: list[ThroughputRow] = Field(default_factory=list)
    verdict: VerdictSection | None = None
    packages: Packages | None = None
    layers: LayersSection | None = None

    @classmethod
    def load(cls, path: Path) -> Report:
        """Read a report.json; a file that does not fit the model is an input error naming it (exit 2)."""
        with _readable(str(path)):
            return cls.model_validate_json(path.read_bytes())

    def artifact(self, name: str) -> ArtifactRecord | None:
        return next((row for row in self.artifacts if row.name == name), None)

    @property
    def sizes(self) -> dict[str, int | None]:
        """Artifact name -> size in bytes."""
        return {row.name: row.size_bytes for row in self.artifacts}


def as_report(report: Report | Mapping[str, Any], label: str = "report") -> Report:
    """The typed report of a report or of its JSON form (a dict read from report.json: validated here, where a
    malformed one is an input error naming ``label``)."""
    if isinstance(report, Report):
        return report
    with _readable(label):
        return Report.model_validate(dict(report))


_ROWS = ("validation", "benchmarks", "throughput", "gates", "failures", "unmeasured", "artifacts")


@contextmanager
def _readable(label: str) -> Iterator[None]:
    """A report that does not fit the model is an input error (exit 2) naming ``label`` and the field, never a
    traceback: report.json is a file a user may have edited."""
    try:
        yield
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "the report"
        more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
        loc = first["loc"]
        what = "has a row qdeploy cannot read" if len(loc) > 2 and loc[0] in _ROWS and isinstance(loc[1], int) \
            else "is not shaped as qdeploy writes it"
        raise QdeployInputError(f"{label}: report.json {what} ({where}: {first['msg']}){more}; was it written by "
                                "another version of qdeploy, or edited? run the recipe again to rewrite it") from None
    except (TypeError, ValueError) as exc:  # not a JSON object at all
        raise QdeployInputError(f"{label}: report.json is not shaped as qdeploy writes it "
                                f"({type(exc).__name__}: {exc}); was it edited?") from None


def report_schema() -> dict[str, Any]:
    """The JSON schema of report.json, generated from the model."""
    schema = Report.model_json_schema()
    schema["title"] = "qdeploy report.json"
    schema["description"] = f"report.json, schema_version {REPORT_SCHEMA_VERSION}: {schema.get('description') or ''}"
    return schema
