"""What `qdeploy check` verifies beyond loading the recipe, so that it refuses what `run` would refuse, running nothing.

Loading (``pipeline.loader``) checks the recipe, its files' kinds and the factory's name.  Here: the model (read,
its overrides applied, onnx's checker and strict type inference), then every dataset a stage of the run reads,
against the inputs the exported model will have, from the samples' headers (``calibration.headers``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from qdeploy.calibration.headers import check_dataset_fits
from qdeploy.core.errors import DataError
from qdeploy.pipeline.recipe import registry
from qdeploy.pipeline.recipe.text_data import check_text_tokenizers, with_model_tokenizer
from qdeploy.stages.export import inspect_source
from qdeploy.stages.validate import check_metric, read_labels

if TYPE_CHECKING:
    from qdeploy.pipeline.recipe.schema import Recipe

__all__ = ["check_before_run", "datasets_read"]


def check_before_run(recipe: Recipe) -> None:
    """ModelError or DataError (exit 2) for a model or a dataset the run would refuse."""
    inputs = inspect_source(recipe.model, recipe.resolve)
    check_text_tokenizers(recipe.data, recipe.model, datasets_read(recipe))  # loads no tokenizer
    for name in datasets_read(recipe):
        spec = recipe.data[name]
        if spec.path is not None:
            check_dataset_fits(name, spec, recipe.resolve(spec.path), inputs)
    check_task_budgets(recipe, [info.name for info in inputs])


def check_task_budgets(recipe: Recipe, input_names: list[str]) -> None:
    """A quantize or fp16 budget on a task metric (``tolerance: {metric: ..., max_drop: ...}``) needs the metric's
    function and labelled budget data: RecipeError or DataError (exit 2) naming the variant and what to do."""
    for variant, steps in recipe.variants.items():
        for step in steps:
            budget = step.config.task_budget()  # its metric named by now (the recipe's validate.metric if not its own)
            if budget is None or budget.metric is None:
                continue
            metric, dataset = budget.metric, budget.data
            check_metric(metric, recipe.resolve, f"variants.{variant}.{step.stage}.tolerance.metric")
            where = f"variant '{variant}': the {step.stage} tolerance on a task metric ({metric})"
            if dataset is None:
                raise DataError(f"{where} needs labelled budget data, and its budget reads seeded random data: set "
                                "budget.data (or calibration.data) to an npy dataset whose .npz samples hold a "
                                "'label' array")
            datasets = with_model_tokenizer(recipe.data, recipe.model, recipe.resolve)  # as the stages read them
            if read_labels(datasets, recipe.resolve, dataset, input_names, budget.samples) is None:
                raise DataError(f"{where} needs labels, and the budget dataset '{dataset}' has none: give its .npz "
                                "samples a 'label' (or 'labels') array beside the inputs (docs/validate.md)")


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
