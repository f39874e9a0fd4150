"""Refuse a model too large for this machine up front, with the estimate, instead of being killed half-way.

A run's phases come one after another (export, each variant's stages, validation, the benchmark), and each
holds a bounded share of the model: a stage its input and output, validation one session at a time (each
closed before the next is created, the outputs of a pair dropped once compared), the benchmark at most
``qdeploy.pipeline.run.residency``'s budget of sessions at once.  So the whole run's peak is its largest phase's,
and each phase's peak is about a fixed multiple of the model's size on disk (weights plus graph) above
``FIXED_OVERHEAD``: ``STAGE_FACTORS`` holds those multiples as measured by ``benchmarks/large_models.py``
(per stage and for the whole run, docs/large-models.md), with a margin.  The whole run stays under 2.5x the
model plus ``FIXED_OVERHEAD``, except where a dynamic int8 variant meets an OpenVINO target
(``OPENVINO_DYNAMIC``: OpenVINO decompresses its weights to float32 beside its own copy).  Before the export,
the run's largest estimate is compared with the memory available now (``MemAvailable``); a run that would not
fit stops with exit 2 and says what it needs.  ``QDEPLOY_AVAILABLE_MEMORY`` (bytes, or with a K/M/G suffix)
overrides what this machine reports: tests use it to fake a small machine, and a user sharing a machine can use
it to leave room for others.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING

from qdeploy.core.errors import QdeployInputError
from qdeploy.stages.export import model_size_on_disk

if TYPE_CHECKING:
    from qdeploy.pipeline.recipe.schema import Recipe

__all__ = ["FIXED_OVERHEAD", "MEMORY_ENV", "OPENVINO_DYNAMIC", "STAGE_FACTORS", "MemoryTooSmallError",
           "available_memory", "check_fits", "check_recipe_fits", "estimate_peak", "memory_override", "parse_bytes",
           "stages_of"]

from qdeploy.core.memory import MEMORY_ENV, available_memory, memory_override, parse_bytes

log = logging.getLogger(__name__)

OPENVINO_DYNAMIC = "dynamic int8 on openvino"
"""The phase a run has when a dynamic int8 variant meets an OpenVINO target (its stage's int8 kernel count, its
validation and its benchmark each compile it there)."""
STAGE_FACTORS: dict[str, float] = {
    "export": 2.0, "simplify": 2.0, "fp16": 2.0, "quantize": 2.5, "validate": 2.5, "benchmark": 2.5,
    OPENVINO_DYNAMIC: 3.2,
}
"""Peak resident memory of each phase above ``FIXED_OVERHEAD`` as a multiple of the model's bytes: the largest
measured on models of 0.5 to 4 GB (docs/large-models.md), rounded up.  quantize: ptq 1.9, int4 1.6; validate:
one session at a time, OpenVINO's of a float32 model the largest (1.8-2.0); benchmark: the residency budget
(2x the model, at least 1 GB) and a session being loaded (2.4 in a whole run at 2.2 GB); OPENVINO_DYNAMIC:
2.5-3.0 (quantize's kernel count, validation and benchmark of the dynamic artifact on OpenVINO)."""
FIXED_OVERHEAD = 600_000_000
"""Python, onnx, ONNX Runtime and OpenVINO loaded: what a stage takes before the model."""


class MemoryTooSmallError(QdeployInputError):
    """The model needs more memory than this machine has available."""


def stages_of(recipe: Recipe, variants: list[str]) -> list[str]:
    """The phases a run goes through: export, each selected variant's steps, validation, benchmark, and
    ``OPENVINO_DYNAMIC`` where a dynamic int8 variant meets an OpenVINO target."""
    stages = ["export"]
    for variant in variants:
        stages += [step.stage for step in recipe.variants[variant] if step.stage not in stages]
    stages.append("validate")
    if recipe.benchmark.enabled:
        stages.append("benchmark")
    if _dynamic_on_openvino(recipe, variants):
        stages.append(OPENVINO_DYNAMIC)
    return stages


def _dynamic_on_openvino(recipe: Recipe, variants: list[str]) -> bool:
    dynamic = any(step.config.quantizes_at_run_time() for variant in variants for step in recipe.variants[variant])
    return dynamic and any(target.startswith("openvino:") for target in recipe.targets)


def estimate_peak(model_bytes: int, stages: list[str]) -> tuple[str, int]:
    """The stage with the largest estimated peak and that peak in bytes."""
    worst = max(stages, key=lambda stage: STAGE_FACTORS.get(stage, 3.0))
    return worst, int(STAGE_FACTORS.get(worst, 3.0) * model_bytes) + FIXED_OVERHEAD


def check_fits(model_path: Path, model_bytes: int, stages: list[str]) -> None:
    """Raise MemoryTooSmallError when the estimated peak of the run is above the memory available."""
    stage, need = estimate_peak(model_bytes, stages)
    have = available_memory()
    source = f"{MEMORY_ENV}={os.environ[MEMORY_ENV]}" if memory_override() is not None else "MemAvailable"
    log.info("memory plan: model %.2f GB, peak estimate %.2f GB (%s), available %.2f GB (%s)",
             model_bytes / 1e9, need / 1e9, stage, have / 1e9, source)
    if need > have:
        raise MemoryTooSmallError(
            f"model {model_path} is {model_bytes / 1e9:.2f} GB with its external data; {_phase(stage)} needs about "
            f"{need / 1e9:.1f} GB ({STAGE_FACTORS.get(stage, 3.0):g}x the model plus "
            f"{FIXED_OVERHEAD / 1e9:.1f} GB), but only {have / 1e9:.1f} GB is available ({source}). Run on a machine "
            "with more memory, free memory, or leave out the variants of that stage (--variant)")


def _phase(stage: str) -> str:
    """How the refusal names a phase."""
    if stage == OPENVINO_DYNAMIC:
        return "a dynamic int8 variant on OpenVINO (OpenVINO decompresses its weights to float32)"
    return f"stage '{stage}'"


def check_recipe_fits(recipe: Recipe, variants: list[str]) -> None:
    """The up-front check of a run from an ONNX file (a torch model's size is known only after its export)."""
    if recipe.model.onnx is None:
        return

    path = recipe.resolve(recipe.model.onnx)
    size = model_size_on_disk(path)
    if size is not None:
        check_fits(path, size, stages_of(recipe, variants))
