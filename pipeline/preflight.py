"""What `qdeploy check` verifies beyond loading the recipe, so that it refuses what `run` would refuse, running nothing.

Loading (``pipeline.loader``) checks the recipe, its files' kinds and the factory's name.  Here: the model (read,
its overrides applied, onnx's checker and strict type inference), then every dataset a stage of the run reads,
against the inputs the exported model will have, from the samples' headers (``calibration.headers``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from qdeploy.calibration.headers import check_dataset_fits
from qdeploy.pipeline import registry
from qdeploy.stages.export import inspect_source

if TYPE_CHECKING:
    from qdeploy.pipeline.recipe import Recipe

__all__ = ["check_before_run", "datasets_read"]


def check_before_run(recipe: Recipe) -> None:
    """ModelError or DataError (exit 2) for a model or a dataset the run would refuse."""
    inputs = inspect_source(recipe.model, recipe.resolve)
    for name in datasets_read(recipe):
        spec = recipe.data[name]
        if spec.path is not None:
            check_dataset_fits(name, spec, recipe.resolve(spec.path), inputs)


def datasets_read(recipe: Recipe) -> list[str]:
    """The recipe's datasets a run reads (stages' calibration data, validation's and the benchmark's), in order;
    a dataset declared and never used is not the run's concern (a sweep's shared data may hold other models')."""
    names: list[str | None] = []
    for steps in recipe.variants.values():
        for step in steps:
            names += registry.transform_stage(step.stage).datasets_used(step.config)
    names.append(recipe.validate_.data)
    if recipe.benchmark.enabled:
        names.append(recipe.benchmark.data)
    return [name for name in dict.fromkeys(names) if name is not None and name in recipe.data]
