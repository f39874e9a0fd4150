"""Where a package comes from: the run (its report.json's sha256) and the tolerances of the run's recipe.

A package's check holds each output to the limits validation held it to.  Those limits are not taken from
report.json's rows (one editable file) but computed again from the run's recipe snapshot, whose section hashes
report.json records, with validation's own rules: the variant's steps, parsed by their stages' models, declare
their budget's limits as the run declared them (``qdeploy.core.stage_config.variant_tolerance``), and
``stages.validate.output_tolerances`` gives each output's limits from that; report.json's rows
must agree, or the package is refused.  Loosening a tolerance therefore takes editing the recipe snapshot AND
report.json's section hashes AND its rows consistently: this is a check against mistakes and casual edits,
not a signature (docs/robustness.md).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import ValidationError

from qdeploy.core.context import artifact_precision
from qdeploy.core.detections import output_of
from qdeploy.core.errors import QdeployInputError
from qdeploy.core.rows import ValidationRow
from qdeploy.core.runtimes import artifact_of, is_device_default
from qdeploy.core.stage_config import StageConfig, variant_tolerance
from qdeploy.core.tolerance import Tolerance
from qdeploy.graph.measured_integers import measured_integers
from qdeploy.pipeline.recipe import registry
from qdeploy.stages.validate import (
    ValidateConfig,
    measured_integer_limits,
    output_tolerances,
    row_basis,
    tolerance_for,
)

__all__ = ["ARBITRATED_SLACK_DB", "FROM_RECIPE", "FROM_REPORT", "arbitrated_limits", "declared_in_snapshot",
           "recipe_tolerances", "recorded_tolerances"]

FROM_RECIPE = "the run's recipe (recipe.snapshot.json; its validate and variants hashes are in report.json)"
ARBITRATED_SLACK_DB = 1.0
"""How much further from the reference than its validated artifact a package of a row passed by arbitration may be."""
FROM_REPORT = "report.json's validation row (the run stored no recipe snapshot: an older qdeploy made it)"


def recorded_tolerances(validation: ValidationRow) -> dict[str, dict[str, float]]:
    """Output -> the limits report.json's row says validation held it to."""
    return {out["name"]: out.get("tolerance") or validation.tolerance or {}
            for out in validation.outputs or [] if out.get("name")}


def recipe_tolerances(snapshot: dict[str, Any], validation: ValidationRow,
                      model_path: Path) -> dict[str, dict[str, float]]:
    """Output -> the limits the run's recipe gives this (variant, target), computed as validation computes them.

    Raises QdeployInputError (exit 2) when report.json's row records another precision or other limits."""
    where = f"report.json's validation of '{validation.variant}' on {validation.target}"
    steps = (snapshot.get("variants") or {}).get(artifact_of(validation.variant))  # fp32@default: fp32's steps
    if not isinstance(steps, list):
        raise QdeployInputError(f"{where}: the run's recipe has no variant '{validation.variant}'; was report.json "
                           "edited? run the recipe again")
    precision = artifact_precision([step.get("stage") for step in steps if isinstance(step, dict)], model_path)
    if validation.precision != precision:
        raise QdeployInputError(f"{where} says precision {validation.precision}; the run's recipe builds {precision}. "
                           "Was report.json edited? run the recipe again")
    config = ValidateConfig.model_validate(snapshot.get("validate") or {})
    declared = declared_in_snapshot(steps, where)
    basis = _basis(config, declared, precision, model_path, validation)
    base, per_output, _ = measured_integer_limits(tolerance_for(config, basis, declared),
                                                  output_tolerances(config, basis, declared),
                                                  measured_integers(model_path))
    matched = config.detection_spec()
    expected = {name: matched if matched and name == output_of(matched["boxes"]) else  # validation's entry for it
                per_output.get(name, base).model_dump(exclude_none=True) for name in recorded_tolerances(validation)}
    recorded = recorded_tolerances(validation)
    if recorded != expected or validation.tolerance != base.model_dump(exclude_none=True):
        changed = [name for name in expected if recorded.get(name) != expected[name]] or ["the row's tolerance"]
        raise QdeployInputError(f"{where}: the tolerance of {', '.join(changed)} ({recorded or validation.tolerance}) "
                           f"is not the one the run's recipe gives ({expected}); report.json was edited after the "
                           "run. Run the recipe again, or change the tolerance in the recipe")
    return expected


def arbitrated_limits(tolerances: dict[str, dict[str, Any]], validation: ValidationRow
                      ) -> tuple[dict[str, dict[str, Any]], str]:
    """The limits a package of ``validation``'s artifact is held to against the reference outputs, and what was
    changed.  A row that passed by arbitration (float64 showed ort:cpu's own float32 is what is off: PP-OCRv6's
    tiny detector at 57.7 dB on OpenVINO against fp32's 60) was never within them: its package is held to be as
    close to ort:cpu as the validated artifact was, ``ARBITRATED_SLACK_DB`` of slack, or no package could pass."""
    if (validation.arbitrated or {}).get("verdict") != "reference":
        return tolerances, ""
    slack = 10 ** (ARBITRATED_SLACK_DB / 10)
    measured = {out["name"]: out for out in validation.outputs or [] if out.get("name")}
    lowered = {}
    for name, limits in tolerances.items():
        got, limits = measured.get(name, {}), dict(limits)
        if got.get("cosine") is not None and "cosine_min" in limits and got["cosine"] < limits["cosine_min"]:
            limits["cosine_min"] = 1.0 - (1.0 - got["cosine"]) * slack
        if got.get("snr_db") is not None and "snr_db_min" in limits and got["snr_db"] < limits["snr_db_min"]:
            limits["snr_db_min"] = got["snr_db"] - ARBITRATED_SLACK_DB
        if got.get("max_abs_err") is not None and "atol" in limits and "rtol" not in limits \
                and got["max_abs_err"] > limits["atol"]:
            limits["atol"] = got["max_abs_err"] * 10 ** (ARBITRATED_SLACK_DB / 20)
        lowered[name] = limits
    changed = [name for name in tolerances if lowered[name] != tolerances[name]]
    if not changed:
        return tolerances, ""
    return lowered, (f"lowered for {', '.join(changed)} to what validation measured against the reference, "
                     f"{ARBITRATED_SLACK_DB:g} dB of slack: the row passed by arbitration (float64 showed the "
                     "reference's own float32 is what is off)")


def declared_in_snapshot(steps: list[Any], where: str) -> Tolerance | None:
    """The limits a variant of a recipe snapshot (its steps as dumped) declares: its steps parsed by their stages'
    models, asked as the run asked them (``Recipe.declared_tolerances``); QdeployInputError naming ``where`` when a
    step is not one this qdeploy reads."""
    return variant_tolerance(_configs(steps, where))


def _configs(steps: list[Any], where: str) -> list[StageConfig]:
    configs = []
    for index, step in enumerate(steps):
        try:
            if not isinstance(step, dict):
                raise ValueError("a step of the snapshot is {stage, config}")
            configs.append(registry.transform_stage(str(step.get("stage"))).config.model_validate(step.get("config")))
        except (ValidationError, ValueError) as exc:
            raise QdeployInputError(f"{where}: step {index + 1} of the variant in the run's recipe is not one this "
                                    f"qdeploy reads ({str(exc).splitlines()[0]}); run the recipe again") from None
    return configs


def _basis(config: Any, declared: Tolerance | None, precision: str, model_path: Path,
           validation: ValidationRow) -> str:
    """Whose default limits apply, by validation's own rule (``stages.validate.row_basis``): the integer ops are
    read from the artifact itself; only what ran (bf16, the device default's precision) is taken from the row."""
    return row_basis(precision, model_path, validation.target, validation.execution, declared=declared is not None,
                     recipe_tolerance=config.tolerance is not None,
                     device_default=is_device_default(validation.variant))[0]
