"""Targets that cannot read the model at all: said once per target, not once per variant.

When a runtime cannot read or compile an artifact (``ModelError`` from its adapter), validation marks the row
``unreadable``.  If the reference variant (the model as exported, or ``validate.reference_model``) is
unreadable on that target too, the target cannot run this model whatever qdeploy does to it: the reference's
row keeps the runtime's reason (the one line ``unreadable_targets`` reports), and every other unreadable row on
that target points to it instead of repeating it.  Those rows get the status ``unreadable`` (never passed, and
not failed: a limitation of the target, not of a variant) with ``unreadable: true``; the gates, the verdict and
the exit status agree (``qdeploy.pipeline.results.gates``): such rows fail the run only through a gate naming the
target.  Where the reference is readable, an unreadable artifact is a regression of that artifact: its row loses
the mark and fails as any other.
"""

from __future__ import annotations

from qdeploy.core.rows import ValidationRow

__all__ = ["POINTER", "condense_unreadable", "unreadable_targets"]

POINTER = ("not run: {target} cannot read the original model either (the report's 'unreadable targets' says why, "
           "once); not a failure of this variant")
HINT = ("; when an input such as a sample rate, or an input's length, decides an If, freeze it "
        "(model.inputs: [{name: ..., value: ...}]) or fix its shape (model.inputs[].shape): "
        "docs/export-and-simplify.md")


def condense_unreadable(rows: list[ValidationRow]) -> list[ValidationRow]:
    """The rows with the original's unreadability said once per target (see the module's docstring).  The
    original's rows on the targets are those that measure the noise floor (``noise_floor``)."""
    originals = {row.target for row in rows if row.noise_floor and row.unreadable}
    condensed = []
    for row in rows:
        if not row.unreadable:
            condensed.append(row)
        elif row.target not in originals:  # the original runs there: this artifact broke it
            condensed.append(_unmarked(row))
        elif row.noise_floor:
            condensed.append(row.replace(status="unreadable", reason=_original_reason(row)))
        else:
            condensed.append(row.replace(status="unreadable", reason=POINTER.format(target=row.target)))
    return condensed


def unreadable_targets(rows: list[ValidationRow]) -> dict[str, str]:
    """Target -> why it cannot read the original model (the reference's row on it), for report.json."""
    return {row.target: row.reason for row in rows if row.unreadable and row.noise_floor}


def _original_reason(row: ValidationRow) -> str:
    prefix = f"{row.target} cannot run this artifact: "
    why = row.reason.removeprefix(prefix)
    hint = HINT if row.target.startswith("openvino:") and ("rank" in why or "dynamic" in why) else ""
    return f"{row.target} cannot read the original model: {why}{hint}"


def _unmarked(row: ValidationRow) -> ValidationRow:
    return ValidationRow.model_validate({name: getattr(row, name) for name in row.model_fields_set
                                         if name != "unreadable"})
