"""What a transform stage found, typed: each stage declares its findings as a model of this base.

A stage's findings are the report's (report.json ``artifacts[].lineage[].findings`` and the artifact's sidecar):
``to_report`` gives them in that form.  The stage's own decisions never read them back; they keep their state in
typed attributes, and the runner's guard asks ``unchecked`` whether the stage's own comparison ran.

Nested parts that only the report reads (counts per op type, free-form records) may stay ``dict[str, Any]``
fields; every top-level key is a declared field.  A field that defaults to None is left out of the report while it
is None (a key the stage did not write); a required field shows None as null.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict
from pydantic.fields import FieldInfo

__all__ = ["Findings", "unchecked_record"]

CHECK_RECORDS = ("check", "verification", "fidelity")
"""Keys where a stage whose findings are still a plain dict records its own comparison."""


class Findings(BaseModel):
    """Base of a stage's findings; unknown keys are errors, so that the report's keys are the declared ones."""

    model_config = ConfigDict(extra="forbid")

    def to_report(self) -> dict[str, Any]:
        """The findings as report.json and the sidecar hold them (same keys as the stage's dict findings were)."""
        dumped = self.model_dump(by_alias=True)
        return {key: value for key, value in dumped.items()
                if value is not None or not _optional(type(self).model_fields, key)}

    def unchecked(self) -> str | None:
        """Why the stage's own comparison of the new model with its input did not run; None when it ran or the
        stage has none (``qdeploy.pipeline.guard`` then reports ``checked: false`` with this reason)."""
        return None


def _optional(fields: dict[str, FieldInfo], key: str) -> bool:
    """Whether a report key is one the stage may leave out: a field that defaults to None."""
    info = next((info for name, info in fields.items() if (info.alias or name) == key), None)
    return info is not None and not info.is_required() and info.default is None


def unchecked_record(findings: Mapping[str, Any]) -> str | None:
    """``Findings.unchecked`` for a stage whose findings are still a dict: an "unchecked" or "skipped" reason in its
    check, verification or fidelity record."""
    for key in CHECK_RECORDS:
        record = findings.get(key)
        if isinstance(record, dict):
            for word in ("unchecked", "skipped"):
                if record.get(word):
                    return str(record[word])
    return None
