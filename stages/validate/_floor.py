"""The noise floor: how far the float32 reference disagrees with itself across targets.

The rows that run the reference itself on a target other than ``ort:cpu``
(ORT CPU against OpenVINO CPU at f32, say) carry ``noise_floor: true``; their
metrics are the floor of that target.  Any other row on that target whose
limits the reference itself already breaks there gets those limits listed in
``unattainable``: no artifact can be held to them on that target, however
faithful.  Rows on ``ort:cpu`` compare with a reference computed by the same
runtime and have no floor to meet.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TypedDict

from qdeploy.core.compare import compare_outputs
from qdeploy.core.memory import release_memory

RELEASE_FROM_BYTES = 256_000_000
"""Runs whose largest model reaches this size get each pair's freed memory handed back after the pair (a collection
costs tens of milliseconds: not spent on small models).  The run's largest model decides, not the pair's artifact:
an int4 artifact of a 0.5 GB model is small, but the float32 pairs before it left hundreds of MB freed and not
returned, and the next session loads on top of them."""

if TYPE_CHECKING:
    from qdeploy.core.rows import ValidationRow
    from qdeploy.stages.validate._common import Outcome, Outputs


def floor_outputs(outcomes: list[Outcome]) -> dict[str, Outputs]:
    """Target -> the reference's outputs there, for the floor rows that ran."""
    return {o.row.target: o.outputs for o in outcomes
            if o.row.noise_floor and o.outputs is not None and o.row.measured}


def keep_floor_outputs(outcome: Outcome, largest_model_bytes: int) -> Outcome:
    """The outcome with its outputs only where the floor needs them: outputs are compared as each pair runs, so
    every other pair's are dropped instead of held for every variant and target to the end (a large model's
    outputs, an LLM's logits say, are held once for the reference and once per floor target).  The session is
    closed by now: in a run of large models its freed memory goes back before the next session loads."""
    if not outcome.row.noise_floor:
        outcome.outputs = None
    if largest_model_bytes >= RELEASE_FROM_BYTES:
        release_memory()
    return outcome


def flag_unattainable(outcomes: list[Outcome], reference_outputs: Outputs, reference_label: str) -> None:
    """Fill each measured row's ``unattainable`` with the limits the reference breaks on its target."""
    floors = floor_outputs(outcomes)
    for outcome in outcomes:
        row = outcome.row
        floor = floors.get(row.target)
        if row.noise_floor or floor is None or outcome.tolerance is None:
            continue
        comparison = compare_outputs(reference_outputs, floor, outcome.tolerance, outcome.per_output,
                                     outcome.detections)
        outcome.row = row.replace(unattainable=[
            f"{reason}, already for the reference {reference_label} itself on {row.target} "
            f"(noise floor against ort:cpu)" for reason in comparison.reasons])


class FloorTargetMetrics(TypedDict):
    """The reference's disagreement with ort:cpu on one target (``noise_floor.targets``)."""

    max_abs_err: float | None
    mean_abs_err: float | None
    cosine: float | None
    snr_db: float | None
    status: str


class FloorSummary(TypedDict):
    """The report's top-level ``noise_floor`` (``qdeploy.core.report_parts.NoiseFloor`` reads it back)."""

    against: str
    variant: str
    targets: dict[str, FloorTargetMetrics]


def noise_floor_summary(validation: list[ValidationRow]) -> FloorSummary | None:
    """The floor for the report's top level: per target, the reference's own disagreement with ort:cpu.

    ``{"against": "ort:cpu", "variant": <the floor rows' variant>, "targets": {target: {max_abs_err,
    mean_abs_err, cosine, snr_db, status}}}``, or None when no floor row was measured (one target only).
    """
    rows = [row for row in validation if row.noise_floor and row.metrics.measured]
    if not rows:
        return None
    return {"against": "ort:cpu", "variant": rows[0].variant,
            "targets": {row.target: {"max_abs_err": row.metrics.max_abs_err, "mean_abs_err": row.metrics.mean_abs_err,
                                     "cosine": row.metrics.cosine, "snr_db": row.metrics.snr_db, "status": row.status}
                        for row in rows}}
