"""Refuse a model too large for this machine up front, with the estimate, instead of being killed half-way.

Each stage's peak resident memory is about a fixed multiple of the model's size on disk (weights plus graph):
``STAGE_FACTORS`` holds those multiples as measured by ``benchmarks/large_models.py`` (docs/large-models.md), with
a margin.  Before the export, the run's largest estimate is compared with the memory available now
(``MemAvailable``); a run that would not fit stops with exit 2 and says what it needs.  ``QDEPLOY_AVAILABLE_MEMORY``
(bytes, or with a K/M/G suffix) overrides what this machine reports: tests use it to fake a small machine, and a
user sharing a machine can use it to leave room for others.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING

from qdeploy.core.errors import QdeployInputError
from qdeploy.stages.export._model import model_size_on_disk

if TYPE_CHECKING:
    from qdeploy.pipeline.recipe import Recipe

__all__ = ["FIXED_OVERHEAD", "MEMORY_ENV", "STAGE_FACTORS", "MemoryTooSmallError", "available_memory", "check_fits",
           "check_recipe_fits", "estimate_peak", "memory_override", "parse_bytes", "stages_of"]

from qdeploy.core.memory import MEMORY_ENV, available_memory, memory_override, parse_bytes

log = logging.getLogger(__name__)

STAGE_FACTORS: dict[str, float] = {
    "export": 2.0, "simplify": 2.0, "fp16": 2.0, "quantize": 3.0, "validate": 3.5, "benchmark": 3.5,
}
"""Peak resident memory of each stage above ``FIXED_OVERHEAD`` as a multiple of the model's bytes: the largest
measured on models of 0.5 to 2.2 GB (docs/large-models.md), rounded up (quantize: dynamic's OpenVINO kernel
count, 2.5; validate: a dynamic artifact on OpenVINO, 2.8; benchmark: not measured at size, as validate)."""
FIXED_OVERHEAD = 600_000_000
"""Python, onnx, ONNX Runtime and OpenVINO loaded: what a stage takes before the model."""


class MemoryTooSmallError(QdeployInputError):
    """The model needs more memory than this machine has available."""


def stages_of(recipe: Recipe, variants: list[str]) -> list[str]:
    """The stages a run goes through: export, each selected variant's steps, validation, benchmark."""
    stages = ["export"]
    for variant in variants:
        stages += [step.stage for step in recipe.variants[variant] if step.stage not in stages]
    stages.append("validate")
    if recipe.benchmark.enabled:
        stages.append("benchmark")
    return stages


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
            f"model {model_path} is {model_bytes / 1e9:.2f} GB with its external data; stage '{stage}' needs about "
            f"{need / 1e9:.1f} GB ({STAGE_FACTORS.get(stage, 3.0):g}x the model plus "
            f"{FIXED_OVERHEAD / 1e9:.1f} GB), but only {have / 1e9:.1f} GB is available ({source}). Run on a machine "
            "with more memory, free memory, or leave out the variants of that stage (--variant)")


def check_recipe_fits(recipe: Recipe, variants: list[str]) -> None:
    """The up-front check of a run from an ONNX file (a torch model's size is known only after its export)."""
    if recipe.model.onnx is None:
        return

    path = recipe.resolve(recipe.model.onnx)
    size = model_size_on_disk(path)
    if size is not None:
        check_fits(path, size, stages_of(recipe, variants))
