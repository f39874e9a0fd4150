"""What a stage's settings declare to the pipeline, so that the pipeline never reads a stage's fields by name.

Every stage's settings model derives from ``StageConfig``.  Its methods answer the pipeline's questions: the
output limits an artifact was built to (``declared_tolerance``), the task-metric budget and its data
(``task_budget``), whether the stage builds one graph per runtime (``per_runtime_build``, ``for_runtime``), and
whether the artifact quantizes activations at run time (``quantizes_at_run_time``).  The defaults say "none"; a
stage whose settings have such a thing overrides the method that says so (``stages/quantize/config.py``,
``stages/fp16/config.py``).  ``variant_tolerance`` is the one rule for the limits a variant's validation holds
it to: validation, the runner and a package's provenance all ask it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from qdeploy.core.tolerance import StrictModel, TaskTolerance, Tolerance

if TYPE_CHECKING:
    from typing_extensions import Self

__all__ = ["PerRuntime", "StageConfig", "TaskBudget", "variant_tolerance"]

PerRuntime = Literal["never", "always", "auto"]
"""How a step builds across the runtimes of the targets: ``never`` one graph for every target (or one shaped for
a runtime the step names), ``always`` one graph per runtime, ``auto`` one per runtime where the runtimes want
different graphs for the model (decided when the step is built: ``qdeploy.pipeline.run.per_runtime``)."""


@dataclass(frozen=True)
class TaskBudget:
    """An accuracy budget on the user's task metric, and the labelled data it is measured on."""

    tolerance: TaskTolerance
    data: str | None
    """The budget's dataset; None: seeded random data (which has no labels)."""
    samples: int

    @property
    def metric(self) -> str | None:
        """The metric's 'file.py:function'; None until the recipe names validate.metric for it."""
        return self.tolerance.metric


class StageConfig(StrictModel):
    """Base of every stage's settings: unknown keys are errors, and the declarations below default to none."""

    def declared_tolerance(self) -> Tolerance | None:
        """The output limits this step's artifact was built to meet (an accuracy budget's), or None."""
        return None

    def task_budget(self) -> TaskBudget | None:
        """This step's accuracy budget on a task metric, or None."""
        return None

    def with_task_metric(self, metric: str) -> Self:
        """These settings with ``metric`` named in a task-metric budget that names none (the recipe's
        validate.metric); the settings themselves where there is no such budget."""
        return self

    def per_runtime_build(self) -> PerRuntime:
        """Whether the step builds one graph per runtime of the targets."""
        return "never"

    def for_runtime(self, runtime: str) -> Self:
        """These settings for one runtime's build; only asked of settings whose ``per_runtime_build`` is not
        ``never``."""
        raise TypeError(f"{type(self).__name__} builds one graph for every runtime; it has no build for {runtime}")

    def quantizes_at_run_time(self) -> bool:
        """Whether the artifact quantizes activations at run time (dynamic int8: OpenVINO then decompresses its
        weights to float32, which the memory plan counts)."""
        return False


def variant_tolerance(configs: Iterable[StageConfig]) -> Tolerance | None:
    """The limits a variant built by steps with ``configs`` declares: its last step's accuracy budget in output
    limits, or None (then validation's own limits apply).  A budget on a task metric declares no output limits."""
    declared = [tolerance for config in configs if (tolerance := config.declared_tolerance()) is not None]
    return declared[-1] if declared else None
