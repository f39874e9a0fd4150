"""Settings of the validate stage (the recipe's ``validate`` section); the recipe imports this module only."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator

from qdeploy.core.detections import IOU_MIN, MATCH_MIN, SCORE_THRESHOLD, parse_column
from qdeploy.core.lm_metrics import BUILTIN_METRICS
from qdeploy.core.stage_config import StageConfig
from qdeploy.core.tolerance import StrictModel, Tolerance

__all__ = ["RANDOM_DATA_WARNING", "REFERENCE_MODEL_ROW", "REFERENCE_TARGET", "Detections", "ValidateConfig"]


REFERENCE_TARGET = "ort:cpu"
REFERENCE_MODEL_ROW = "reference_model"
"""Variant name of the rows that run validate.reference_model itself on the other targets (its noise floor)."""
RANDOM_DATA_WARNING = "validated on seeded random inputs: random data can hide accuracy errors; set validate.data"


class Detections(StrictModel):
    """Outputs of a detector compared as detections: boxes matched by IoU (``qdeploy.core.detections``)."""

    boxes: str = Field(description="Output of the boxes, [N, 4] per image or [B, N, 4]; or four columns of a packed "
                                   "output's last axis: 'det[0:4]'.")
    scores: str | None = Field(default=None, description="Output (or column: 'det[4]') of each box's score: "
                                                         "candidates are matched highest score first.")
    labels: str | None = Field(default=None, description="Output (or column: 'det[5]') of each box's class: a box "
                                                         "matches only a box of the same class.")
    box_format: Literal["xyxy", "xywh", "cxcywh"] = Field(default="xyxy", description="How the four numbers read.")
    iou_min: float = Field(default=IOU_MIN, gt=0.0, le=1.0, description="Smallest IoU of a match.")
    score_threshold: float | None = Field(
        default=SCORE_THRESHOLD,
        description="Detections scoring at or below it are left out on both sides (padding rows score 0); null "
                    "keeps every row.")
    match_min: float = Field(default=MATCH_MIN, ge=0.0, le=1.0,
                             description="Smallest share of the reference's detections matched (recall) and of the "
                                         "candidate's (precision).")
    score_atol: float | None = Field(default=None, ge=0.0,
                                     description="Largest score difference of a matched pair; unchecked when absent.")

    @field_validator("boxes", "scores", "labels")
    @classmethod
    def _column_form(cls, value: str | None) -> str | None:
        if value is not None and (not value or ("[" in value and parse_column(value)[1] is None)):
            raise ValueError("name an output, or columns of its last axis: 'det[0:4]', 'det[4]'")
        return value


class ValidateConfig(StageConfig):
    """The recipe's `validate` section."""

    data: str | None = Field(default=None, description="Dataset name from 'data'; seeded random data when absent.")
    reference: str | None = Field(
        default=None, description="Reference variant; the exported model as it is ('exported') when absent."
    )
    reference_model: str | None = Field(
        default=None,
        description="ONNX file (relative to the recipe) whose ort:cpu outputs are the reference instead of the "
                    "reference variant's, to check a model converted elsewhere against its original; its inputs "
                    "and outputs must match the artifacts'. 'reference' then only names the speedup baseline.",
    )
    tolerance: Tolerance | None = Field(
        default=None, description="Limits for every variant; defaults per precision (fp32, fp16, int8, int4) "
                                   "otherwise. A variant whose quantize or fp16 step has an accuracy budget "
                                   "('tolerance') is held to that tolerance instead."
    )
    outputs: dict[str, Tolerance] = Field(
        default_factory=dict,
        description="Per-output limits by output name: the fields given replace those of 'tolerance' (or of the "
                    "precision's default) for that output; a field set to null removes that limit.",
    )
    detections: Detections | None = Field(
        default=None,
        description="A detector's outputs (an in-graph NonMaxSuppression returns as many boxes as survive it) "
                    "compared by matching boxes by IoU instead of element by element; the outputs it names take "
                    "no other limits.")
    samples: int = Field(default=8, ge=1, description="How many samples of the dataset to compare at most.")
    metric: str | None = Field(
        default=None,
        description="Task metric 'file.py:function' (relative to the recipe) or 'package.module:function', called "
                    "as function(outputs, labels) -> float, higher is better; or a built-in metric of a language "
                    f"model's logits and a text dataset's token labels ({', '.join(BUILTIN_METRICS)}: perplexity is "
                    "lower-is-better). Reported as task_metric (the reference's as task_metric_reference, with "
                    "task_metric_name and task_metric_direction) and usable in gates.",
    )
    metric_timeout_seconds: float | None = Field(
        default=None, gt=0,
        description="Most seconds one call of the metric may take (300 when absent): a metric that does not return "
                    "in time, exits (sys.exit) or raises KeyboardInterrupt is reported as failing, and a metric "
                    "that timed out is not called again.",
    )
    localize: bool = Field(
        default=True,
        description="When a pair fails, run both models with intermediate outputs exposed and name the first "
                    "node whose output diverges beyond the limits.",
    )
    localize_samples: int = Field(
        default=2, ge=1, description="How many of the worst samples the divergence search runs on."
    )
    fp16_reference: Literal["auto", "always", "never"] = Field(
        default="auto",
        description="Also validate fp16 artifacts on reference:cpu, which computes each op in float16 as declared "
                    "(CPU providers compute most fp16 ops in float32 and hide overflow): 'auto' when no GPU target "
                    "of the recipe is available, 'always', or 'never'.",
    )
    fp16_reference_samples: int = Field(
        default=2, ge=1, description="Samples of the reference:cpu check (the reference evaluator is slow)."
    )

    def detection_spec(self) -> dict[str, Any] | None:
        """validate.detections as the plain dict the matcher, the stages' comparisons, packages and cache keys
        read (``qdeploy.core.detections``); None when it is not set."""
        return self.detections.model_dump(mode="json") if self.detections is not None else None

    @field_validator("metric")
    @classmethod
    def _metric_form(cls, value: str | None) -> str | None:
        if value is not None and value not in BUILTIN_METRICS and (":" not in value or not all(value.rsplit(":", 1))):
            raise ValueError("metric must be 'file.py:function', 'package.module:function' or a built-in metric "
                             f"({', '.join(BUILTIN_METRICS)})")
        return value
