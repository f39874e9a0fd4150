"""Fields that several quantize modes share (``config.py``): one definition, each mode's model naming it."""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from qdeploy.core.tolerance import AnyTolerance, TaskTolerance  # TaskTolerance: shared with fp16

__all__ = ["VERIFY_TARGETS", "Budget", "BudgetSettings", "BudgetTolerance", "Calibration", "CalibrationRef",
           "ExcludeNodes", "ExcludeOpTypes", "ExcludePatterns", "NotForMode", "OpTypes", "PerChannel", "ReduceRange",
           "SymmetricWeights", "TaskTolerance", "VerifyTargets", "WeightType"]

VERIFY_TARGETS = ("ort:cpu", "openvino:cpu")
"""Targets a quantized artifact is loaded on before it is published (``verify_targets``'s default)."""


class NotForMode(ValueError):
    """A field of another mode: ``QuantizeConfig`` reports it at the field."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


class CalibrationRef(BaseModel):
    """Which data a stage calibrates on: a dataset of the recipe, or seeded random data."""

    model_config = ConfigDict(extra="forbid")

    data: str | None = Field(default=None, description="Dataset name from the recipe's 'data'; seeded random data "
                                                       "shaped from the model when absent.")
    samples: int = Field(default=32, ge=1, description="How many samples to calibrate on at most.")


class BudgetSettings(BaseModel):
    """Where and how far the accuracy budget searches."""

    model_config = ConfigDict(extra="forbid")

    data: str | None = Field(default=None, description="Dataset the budget is measured on; the calibration data "
                                                       "(or seeded random data) when absent.")
    samples: int = Field(default=16, ge=1, description="How many samples of that dataset to measure on.")
    max_float_nodes: int | None = Field(default=None, ge=1, description="Most quantized nodes kept in float; no "
                                                                        "limit when absent.")
    max_seconds: float | None = Field(default=None, gt=0, description="Stop the search after this many seconds "
                                                                      "with the best model found so far, and say "
                                                                      "so; no limit when absent.")
    weigh_latency: bool = Field(default=False, description="Among kept-float sets that hold the tolerance, prefer "
                                                           "the one whose float nodes cost least time on the "
                                                           "target (per-node timing; docs/quantize-budget.md).")


def _compile(patterns: list[str]) -> list[str]:
    for pattern in patterns:
        try:
            re.compile(pattern)
        except re.error as exc:
            raise ValueError(f"exclude_patterns: '{pattern}' is not a regular expression: {exc}") from None
    return patterns


def _named(op_types: list[str] | None) -> list[str] | None:
    if op_types is not None and not op_types:
        raise ValueError("op_types is empty: name op types to quantize, or leave it out for the mode's default")
    return op_types


Calibration = CalibrationRef | None
"""The mode gives its own description (what the data is for there)."""
ExcludeNodes = Annotated[list[str], Field(default_factory=list, description="Node names to leave in float.")]
ExcludeOpTypes = Annotated[list[str], Field(default_factory=list, description="Op types whose nodes stay in "
                                                                               "float.")]
ExcludePatterns = Annotated[list[str], AfterValidator(_compile), Field(
    default_factory=list, description="Regular expressions; nodes whose name contains a match stay in float.")]
OpTypes = Annotated[list[str] | None, AfterValidator(_named), Field(
    description="Op types to quantize (ptq: instead of op_set; dynamic: ORT's integer ops when absent, Conv left "
                "out with int8 weights: ORT has no int8-weight ConvInteger; weight_only: MatMul and Gather, both "
                "when absent).")]
SymmetricWeights = Annotated[bool, Field(description="Symmetric weight ranges (zero point 0); OpenVINO runs int8 "
                                                     "convolutions only with symmetric weights. On AMX CPUs the "
                                                     "graph for ONNX Runtime gives its deep convolutions zero "
                                                     "point -1, the same values, to run them on its AMX GEMM "
                                                     "(docs/int8-kernels.md).")]
ReduceRange = Annotated[bool | Literal["auto", "weights", "activations"], Field(
    description="Give up one bit so int8 computes exactly on x86 CPUs without VNNI, whose int8 kernels "
                "(vpmaddubsw) saturate with full-range values: 'weights' (or true) 7-bit weights, ONNX Runtime's "
                "reduce_range; 'activations' 7-bit uint8 activations (ptq, uint8 activations); false: full range, "
                "exact only on VNNI CPUs. 'auto': when a CPU target (ort:cpu, openvino:cpu, ort:openvino) is among "
                "the recipe's targets and weights are int8, ptq builds both 7-bit forms and keeps the one closer to "
                "float32 on calibration data, dynamic (and engine nncf) uses 7-bit weights; whatever CPU builds the "
                "artifact.")]
VerifyTargets = Annotated[list[Literal["ort:cpu", "openvino:cpu"]], Field(
    default_factory=lambda: list(VERIFY_TARGETS),
    description="Targets on which the stage counts the ops that really run int8 kernels.")]
PerChannel = Annotated[bool, Field(description="Quantize weights per output channel.")]
WeightType = Annotated[Literal["int8", "uint8"], Field(description="Weight type.")]
Budget = Annotated[BudgetSettings, Field(default_factory=BudgetSettings, description="Data and limits of the "
                                                                                    "accuracy budget's search.")]
BudgetTolerance = Annotated[AnyTolerance | None, Field(
    description="Accuracy budget against float32: the most harmful quantized nodes stay float until it holds; "
                "output similarity (cosine_min, snr_db_min...) or a task metric ({metric, max_drop})."
)]

