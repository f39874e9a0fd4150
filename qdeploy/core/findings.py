"""What a transform stage found, typed: each stage declares its findings as a model of this base.

A stage's findings are the report's (report.json ``artifacts[].lineage[].findings`` and the artifact's sidecar):
``to_report`` gives them in that form.  The stage's own decisions never read them back; they keep their state in
typed attributes, and the runner's guard asks ``unchecked`` whether the stage's own comparison ran.

Nested parts that only the report reads (counts per op type, free-form records) may stay ``dict[str, Any]``
fields; every top-level key is a declared field.  A field that defaults to None is left out of the report while it
is None (a key the stage did not write); a required field shows None as null.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict
from pydantic.fields import FieldInfo

__all__ = ["Findings"]


class Findings(BaseModel):
    """Base of a stage's findings; unknown keys are errors, so that the report's keys are the declared ones."""

    model_config = ConfigDict(extra="forbid")

    def to_report(self) -> dict[str, Any]:
        """The findings as report.json and the sidecar hold them: one key per declared field that the stage wrote."""
        dumped = self.model_dump(by_alias=True)
        return {key: value for key, value in dumped.items()
                if value is not None or not _optional(type(self).model_fields, key)}

    def unchecked(self) -> str | None:
        """Why the stage's own comparison of the new model with its input did not run; None when it ran or the
        stage has none (``qdeploy.pipeline.run.guard`` then reports ``checked: false`` with this reason)."""
        return None


def _optional(fields: dict[str, FieldInfo], key: str) -> bool:
    """Whether a report key is one the stage may leave out: a field that defaults to None."""
    info = next((info for name, info in fields.items() if (info.alias or name) == key), None)
    return info is not None and not info.is_required() and info.default is None
