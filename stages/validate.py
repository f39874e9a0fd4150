"""The validate stage: every artifact on every target against the float32 reference.

Reference outputs come from the reference variant run on ``ort:cpu``; every
(variant, target) pair is run on the same inputs and compared with them.
Running (pipeline.targets) and comparing (pipeline.compare) stay apart.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from pydantic import Field

from pipeline.tolerance import DEFAULT_TOLERANCES, StrictModel, Tolerance

if TYPE_CHECKING:
    from pipeline.context import Artifact, StageContext

log = logging.getLogger(__name__)

REFERENCE_TARGET = "ort:cpu"
RANDOM_DATA_WARNING = "validated on seeded random inputs: random data can hide accuracy errors; set validate.data"


class ValidateConfig(StrictModel):
    """The recipe's `validate` section."""

    data: str | None = Field(default=None, description="Dataset name from 'data'; seeded random data when absent.")
    reference: str | None = Field(
        default=None, description="Reference variant; the exported model as it is ('exported') when absent."
    )
    tolerance: Tolerance | None = Field(
        default=None, description="Limits for every variant; defaults per precision (fp32, fp16, int8) otherwise."
    )
    samples: int = Field(default=8, ge=1, description="How many samples of the dataset to compare at most.")


Feeds = list[dict[str, np.ndarray]]
Outputs = list[dict[str, np.ndarray]]


def tolerance_for(config: ValidateConfig, precision: str) -> Tolerance:
    """The recipe's tolerance, or the default of the artifact's precision."""
    return config.tolerance or DEFAULT_TOLERANCES[precision]


def run(artifacts: dict[str, Artifact], targets: list[str], config: ValidateConfig,
        ctx: StageContext) -> list[dict[str, Any]]:
    """Validation results, one per (variant, target), in the report's contract."""
    reference_name = ctx.recipe.reference_variant
    reference = artifacts.get(reference_name)
    if reference is None:
        reason = f"reference variant '{reference_name}' was not built; nothing to compare with"
        return [_result(name, target, "error", reason) for name in artifacts for target in targets]
    feeds = list(ctx.samples(config.data, reference.path, limit=config.samples))
    warnings = [RANDOM_DATA_WARNING] if _is_random(config, ctx) else []
    try:
        ctx.on_progress(f"reference {reference_name} on {REFERENCE_TARGET}")
        reference_outputs, _ = _run_artifact(REFERENCE_TARGET, reference, feeds)
    except Exception as exc:  # the reference failing makes every comparison impossible
        reason = f"reference variant '{reference_name}' failed on {REFERENCE_TARGET}: {exc}"
        return [_result(name, target, "error", reason) for name in artifacts for target in targets]
    results = []
    for name, artifact in artifacts.items():
        for target in targets:
            ctx.on_progress(f"validate {name} on {target}")
            result = _validate_pair(name, artifact, target, feeds, reference_outputs, config)
            result["warnings"] = warnings
            results.append(result)
    return results


def _is_random(config: ValidateConfig, ctx: StageContext) -> bool:
    return config.data is None or ctx.recipe.data[config.data].reader == "random"


def _validate_pair(name: str, artifact: Artifact, target: str, feeds: Feeds, reference_outputs: Outputs,
                   config: ValidateConfig) -> dict[str, Any]:
    from pipeline.compare import compare_outputs
    from pipeline.errors import TargetUnavailable
    from pipeline.targets import get_target

    available, reason = get_target(target).availability()
    if not available:
        return _result(name, target, "unavailable", reason)
    try:
        outputs, executed = _run_artifact(target, artifact, feeds)
    except TargetUnavailable as exc:
        return _result(name, target, "unavailable", str(exc))
    except Exception as exc:
        log.debug("validation of %s on %s failed", name, target, exc_info=True)
        return _result(name, target, "error", f"{type(exc).__name__}: {exc}")
    tolerance = tolerance_for(config, artifact.precision)
    comparison = compare_outputs(reference_outputs, outputs, tolerance)
    status = "passed" if comparison.passed else "failed"
    result = _result(name, target, status, "; ".join(comparison.reasons))
    result.update(
        metrics=comparison.worst(),
        outputs=[output.to_dict() for output in comparison.outputs],
        tolerance=tolerance.model_dump(exclude_none=True),
        precision=artifact.precision,
        effective_precision=_effective_precision(artifact.precision, executed),
        execution=executed,
        samples=len(feeds),
    )
    return result


def _run_artifact(target: str, artifact: Artifact, feeds: Feeds) -> tuple[Outputs, dict[str, Any]]:
    from pipeline.targets import get_target

    session = get_target(target).load(artifact.path, pin_f32=True)
    caster = feed_caster(artifact.path)
    outputs = [session.run(caster(feed)) for feed in feeds]
    return outputs, session.executed.to_dict()


def feed_caster(model_path: Path) -> Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]:
    """A function giving a sample in the element types this model declares (an fp16 model may take float16)."""
    from calibration.readers import model_inputs

    dtypes = {info.name: info.dtype for info in model_inputs(model_path)}

    def cast(feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {name: value.astype(dtypes.get(name, value.dtype), copy=False) for name, value in feed.items()}

    return cast


def _effective_precision(precision: str, executed: dict[str, Any]) -> str:
    """What really ran: OpenVINO reports its inference precision; ORT runs the graph's declared types."""
    ran = executed.get("precision")
    if ran and ran != "declared":
        return f"{precision} graph, {ran} inference precision"
    device = executed.get("device", "")
    return f"{precision} graph on {device}" if device else precision


def _result(variant: str, target: str, status: str, reason: str) -> dict[str, Any]:
    return {"variant": variant, "target": target, "status": status, "reason": reason, "metrics": {},
            "effective_precision": None}
