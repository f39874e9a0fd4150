"""What the quantize stage hands the accuracy budget beyond its tolerance: the task metric and the budget data's
labels, the time limit, and the timing sources of latency-aware reverting."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

from qdeploy.core.runtimes import runtime_of_target
from qdeploy.stages.accuracy_budget.latency import TimingSource, timing_sources
from qdeploy.stages.quantize._config_fields import TaskTolerance
from qdeploy.stages.task_metric import Task, labels_missing, task_for

if TYPE_CHECKING:
    from collections.abc import Sequence

    from qdeploy.core.context import StageContext

FIELD = "quantize.tolerance.metric"

__all__ = ["FIELD", "BudgetKeywords", "budget_options", "labels_missing"]


class BudgetKeywords(TypedDict, total=False):
    """``meet_budget``'s keywords beyond the tolerance that the stage's config decides."""

    max_seconds: float | None
    timing: list[TimingSource]
    task: Task


def budget_options(config: Any, ctx: StageContext, model: Path, dataset: str | None, samples: int,
                   runtime: str | None = None) -> BudgetKeywords:
    """The engine's ``meet_budget`` keywords for ``config``: ``task`` (the metric function and one label per budget
    sample), ``max_seconds`` and ``timing`` (the targets' timing sources when ``budget.weigh_latency``)."""
    options = BudgetKeywords(max_seconds=config.budget.max_seconds)
    if config.budget.weigh_latency:
        targets: Sequence[str] = [name for name in ctx.targets
                                     if runtime is None or runtime_of_target(name) == runtime]
        options["timing"] = timing_sources(targets)
    if isinstance(config.tolerance, TaskTolerance):
        options["task"] = task_for(config.tolerance, FIELD, ctx.datasets, ctx.resolve, dataset, _input_names(model),
                                   samples)
    return options


def _input_names(model: Path) -> list[str]:
    import onnx

    graph = onnx.load(str(model), load_external_data=False).graph
    weights = {init.name for init in graph.initializer}
    return [value.name for value in graph.input if value.name not in weights]
