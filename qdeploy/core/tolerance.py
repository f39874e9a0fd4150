"""Tolerances of a comparison against reference outputs, shared by the recipe and the stages."""

from __future__ import annotations

from typing import Annotated, Any, Union

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, model_validator

from qdeploy.core.lm_metrics import BUILTIN_METRICS

__all__ = ["DEFAULT_TOLERANCES", "TOLERANCE_TAGS", "AnyTolerance", "StrictModel", "TaskTolerance", "Tolerance"]


class StrictModel(BaseModel):
    """Base of every recipe model: unknown keys are errors."""

    model_config = ConfigDict(extra="forbid")


class Tolerance(StrictModel):
    """Acceptance limits of one comparison against the reference outputs."""

    cosine_min: float | None = Field(default=None, ge=-1.0, le=1.0, description="Lowest cosine similarity.")
    snr_db_min: float | None = Field(default=None, description="Lowest signal-to-noise ratio in dB.")
    atol: float | None = Field(default=None, ge=0.0, description="Largest absolute error.")
    rtol: float | None = Field(
        default=None, ge=0.0, description="Relative part of the elementwise limit atol + rtol*|ref|."
    )
    top1_agreement_min: float | None = Field(default=None, ge=0.0, le=1.0, description="Lowest top-1 agreement.")
    mismatch_max: float | None = Field(
        default=None, ge=0.0, le=1.0,
        description="Largest share of an integer or bool output's elements that may differ from the reference (class "
                    "labels, indices a selection such as NonMaxSuppression keeps); absent: they must match exactly.")
    integer_values: list[str] | None = Field(
        default=None,
        description="Integer outputs compared as values (cosine_min, snr_db_min, atol and rtol, as a float output "
                    "is) instead of element by element: an image, audio or counts the graph casts from float "
                    "values. Absent: the outputs whose graph ends in a Cast or QuantizeLinear of float values "
                    "(through reshapes, slices, clips and arithmetic); [] holds every integer output to equality.")
    kl_max: float | None = Field(
        default=None, ge=0.0, allow_inf_nan=False,
        description="Largest mean KL divergence KL(softmax(reference) || softmax(candidate)) per token, in nats, on "
                    "outputs of per-token scores ([N, S, V] floats named ...logits, a language model's).")


class TaskTolerance(StrictModel):
    """An accuracy budget on the user's own task metric: the drop from float32 it may lose (the quantize and fp16
    stages' ``tolerance``)."""

    metric: str | None = Field(default=None, description="'file.py:function' (relative to the recipe) or "
                                                         "'package.module:function', called as validate.metric is "
                                                         "(docs/validate.md), higher is better; or a built-in "
                                                         f"metric ({', '.join(BUILTIN_METRICS)}), each with its "
                                                         "own direction (a perplexity rise is a drop). Computed "
                                                         "with the budget data's labels on float32 and on each "
                                                         "candidate. The recipe's validate.metric when absent.")
    max_drop: float | None = Field(default=None, ge=0.0, allow_inf_nan=False,
                                   description="Largest absolute drop of the metric (for a lower-is-better "
                                               "metric such as perplexity: its largest rise).")
    max_relative_drop: float | None = Field(default=None, ge=0.0, le=1.0, allow_inf_nan=False,
                                            description="Largest drop as a share of the float32 metric.")
    metric_timeout_seconds: float | None = Field(
        default=None, gt=0, description="Most seconds one call of the metric may take (300 when absent): a metric "
                                        "that does not return in time, exits (sys.exit) or raises "
                                        "KeyboardInterrupt fails the stage, naming it.")

    @model_validator(mode="before")
    @classmethod
    def _not_mixed(cls, data: Any) -> Any:
        mixed = sorted(set(data) & set(Tolerance.model_fields)) if isinstance(data, dict) else []
        if mixed:
            raise ValueError(f"a tolerance is either output limits ({', '.join(Tolerance.model_fields)}) or a "
                             f"task-metric budget (metric, max_drop or max_relative_drop), not both: {mixed} beside "
                             f"{sorted(set(data) & set(cls.model_fields))}; keep one shape")
        return data

    @model_validator(mode="after")
    def _one_limit(self) -> TaskTolerance:
        if self.metric is not None and ":" not in self.metric and self.metric not in BUILTIN_METRICS:
            raise ValueError(f"metric '{self.metric}' must be 'file.py:function', 'package.module:function' or a "
                             f"built-in metric ({', '.join(BUILTIN_METRICS)})")
        if (self.max_drop is None) == (self.max_relative_drop is None):
            raise ValueError("a task-metric tolerance needs exactly one of max_drop or max_relative_drop")
        return self


TOLERANCE_TAGS = ("output-limits", "task-metric")
"""The names of a tolerance's two shapes in a validation error's location (the recipe loader drops them)."""


def _shape_of(value: Any) -> str:
    """Which shape a tolerance is, by its keys: a task-metric budget names metric, max_drop or max_relative_drop;
    anything else is output limits (whose model then says what is wrong with it, a value that is no mapping too)."""
    if isinstance(value, TaskTolerance) or (isinstance(value, dict) and set(value) & set(TaskTolerance.model_fields)):
        return TOLERANCE_TAGS[1]
    return TOLERANCE_TAGS[0]


AnyTolerance = Annotated[
    Union[Annotated[Tolerance, Tag(TOLERANCE_TAGS[0])], Annotated[TaskTolerance, Tag(TOLERANCE_TAGS[1])]],  # noqa: UP007
    Discriminator(_shape_of),
]
"""A stage's accuracy budget, output limits or a task metric, told apart by its keys (never by which shape
complains less: a mistake in a task-metric budget is reported as that, not as an unknown key of output limits)."""

# Defaults per precision, used when the recipe sets no tolerance (documented in the README).
DEFAULT_TOLERANCES: dict[str, Tolerance] = {
    "fp32": Tolerance(cosine_min=0.9999, snr_db_min=60.0),
    "fp16": Tolerance(cosine_min=0.999, snr_db_min=30.0),
    # bfloat16 keeps 8 significant bits to float16's 11: each rounding is 8x (18 dB) coarser
    "bf16": Tolerance(cosine_min=0.995, snr_db_min=20.0),
    "int8": Tolerance(cosine_min=0.98, snr_db_min=15.0),
    # int4 weights (weight-only, activations float): the int8 limits, which int4 artifacts were held to before
    # they were told apart from int8 ones
    "int4": Tolerance(cosine_min=0.98, snr_db_min=15.0),
}
