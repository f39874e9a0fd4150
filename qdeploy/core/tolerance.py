"""Tolerances of a comparison against reference outputs, shared by the recipe and the stages."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = ["DEFAULT_TOLERANCES", "StrictModel", "TaskTolerance", "Tolerance"]


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


class TaskTolerance(StrictModel):
    """An accuracy budget on the user's own task metric: the drop from float32 it may lose (the quantize and fp16
    stages' ``tolerance``)."""

    metric: str | None = Field(default=None, description="'file.py:function' (relative to the recipe) or "
                                                         "'package.module:function', called as validate.metric is "
                                                         "(docs/validate.md), higher is better; computed with the "
                                                         "budget data's labels on float32 and on each candidate. "
                                                         "The recipe's validate.metric when absent.")
    max_drop: float | None = Field(default=None, ge=0.0, description="Largest absolute drop of the metric.")
    max_relative_drop: float | None = Field(default=None, ge=0.0, le=1.0, description="Largest drop as a share of "
                                                                                      "the float32 metric.")

    @model_validator(mode="after")
    def _one_limit(self) -> TaskTolerance:
        if self.metric is not None and ":" not in self.metric:
            raise ValueError(f"metric '{self.metric}' must be 'file.py:function' or 'package.module:function'")
        if (self.max_drop is None) == (self.max_relative_drop is None):
            raise ValueError("a task-metric tolerance needs exactly one of max_drop or max_relative_drop")
        return self


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
