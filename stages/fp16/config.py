"""Settings of the fp16 stage (a variant step's ``fp16`` settings); the recipe imports this module only."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from qdeploy.core.stage_config import StageConfig, TaskBudget
from qdeploy.core.tolerance import AnyTolerance, TaskTolerance, Tolerance

__all__ = ["FLOAT16_MAX", "MAX_SAFETY_ROUNDS", "REPAIR_SAMPLES", "Fp16Config", "Fp16Data", "effective_op_block_list",
           "reads_default_dataset"]


FLOAT16_MAX = 65504.0
MAX_SAFETY_ROUNDS = 8
REPAIR_SAMPLES = 8
"""The automatic repair (mode 'fixed', `repair`) searches on at most this many samples: its cost grows with them."""


class Fp16Data(BaseModel):
    """Which data the fp16 stage measures activations and fidelity on."""

    model_config = ConfigDict(extra="forbid")

    data: str | None = Field(default=None, description="Dataset name from the recipe's 'data'; seeded random data "
                                                       "shaped from the model when absent.")
    samples: int = Field(default=16, ge=1, description="How many samples to use at most.")


class Fp16Config(StageConfig):
    """Settings of the fp16 stage."""

    model_config = ConfigDict(extra="forbid")

    mode: Literal["fixed", "auto"] = Field(
        default="fixed", description="'fixed': block lists, schema rules and activation ranges decide what stays "
                                     "float32; 'auto': also keep the fewest further nodes, by measured sensitivity, "
                                     "that bring the artifact within 'tolerance' (needs 'calibration').")
    repair: bool = Field(
        default=True, description="With data, in mode 'fixed': when the float16 emulation check misses 'tolerance', "
                                  "keep float32 the fewest further nodes that meet it, as mode 'auto' does (on up "
                                  "to 8 samples; one emulated run per node group, minutes on a large model); "
                                  "false: report the miss only.")
    headroom_db: float = Field(
        default=6.0, ge=0.0, description="With data, in mode 'fixed': the repair runs unless the float16 emulation "
                                         "check meets 'tolerance' made this many dB stricter (SNR + db; 1 - cosine, "
                                         "atol and rtol by the same error power) on the samples pooled and on each "
                                         "alone, and aims at that: float16 error changes from draw to draw and true "
                                         "float16 arithmetic is worse than the emulation. The verdict stays "
                                         "'tolerance'; 0: aim at the tolerance itself.")
    keep_io_types: bool = Field(default=True, description="Keep float32 graph inputs and outputs (Casts inside).")
    min_positive_val: float = Field(
        default=5.96e-08, description="Nonzero constants smaller in magnitude are raised to this (float16's "
                                      "smallest subnormal by default).")
    max_finite_val: float = Field(
        default=FLOAT16_MAX, description="Constants larger in magnitude are clamped to this (float16's largest "
                                         "finite value by default; onnxconverter-common's own default is 1e4).")
    op_block_list: list[str] | None = Field(
        default=None, description="Op types kept in float32; onnxconverter-common's default list when absent.")
    node_block_list: list[str] = Field(default_factory=list, description="Node names kept in float32.")
    calibration: Fp16Data | None = Field(
        default=None, description="Data for activation-aware blocking, budget mode and the fidelity check; "
                                  "when absent, the recipe's validation dataset (validate.data) if it names one "
                                  "(see use_validation_data), else the block lists and static rules only.")
    use_validation_data: bool = Field(
        default=True, description="Without 'calibration', analyse activations and check fidelity on the recipe's "
                                  "validation dataset (up to 16 samples) when validate.data names one, so that an "
                                  "overflow is found when the artifact is built; false: static rules only.")
    safety_margin: float = Field(
        default=0.5, gt=0.0, le=1.0, description="Fraction of max_finite_val a measured activation may reach: "
                                                 "worst cases are predicted as measured / margin (squared for "
                                                 "attention scores, exponentiated for Pow and Exp).")
    tolerance: AnyTolerance | None = Field(
        default=None, description="Limits the emulated float16 outputs must meet against float32 on the data: "
                                  "the target of mode 'auto' and the verdict of the fidelity check (the fp16 "
                                  "defaults of validation when absent); or, in mode 'auto', a task metric's "
                                  "drop ({metric, max_drop | max_relative_drop}, docs/quantize-budget.md) "
                                  "computed with the data's labels.")
    fidelity_check: Literal["emulated", "reference", "off"] = Field(
        default="emulated", description="With data: 'emulated' runs the artifact in ONNX Runtime with every "
                                        "float16 tensor rounded to float16 (fast; overflowing nodes found there "
                                        "are kept in float32 too); 'reference' also runs onnx's reference "
                                        "evaluator, every op in float16 arithmetic (slow); 'off' skips both.")

    keep_layer_norms_float32: bool = Field(
        default=True, description="Keep normalisations written out op by op in float32: LayerNorm (ReduceMean, "
                                  "Sub, Pow, ..., Div), RMSNorm (Pow or Mul of x by itself, ReduceMean, Add eps, "
                                  "Sqrt, Div or Reciprocal and Mul) and L2 norms: their square overflows float16 "
                                  "above |x| = 256, and ONNX Runtime's CPU LayerNorm fusions cannot load them in "
                                  "mixed precision.")
    out_of_range_constants: Literal["keep_float32", "clamp"] = Field(
        default="keep_float32", description="Constants with values beyond max_finite_val (a BatchNormalization "
                                            "variance of 1e8, say): 'keep_float32' keeps them and their readers "
                                            "in float32; 'clamp' clamps them as onnxconverter-common does, which "
                                            "changes results. Values of 1e30 and beyond stand for infinity "
                                            "(masks, Clip bounds) and are clamped either way.")
    onnxruntime_check: bool = Field(
        default=True, description="Load the artifact in ONNX Runtime's CPU provider, default session options, "
                                  "and run the first data sample there, before handing it over (about 0.3 s for "
                                  "a 1,000-node graph); where it fails or crashes, keep float32 the fewest nodes "
                                  "that make it load and run (findings' load_repair). onnx.checker's full check "
                                  "runs always.")

    @model_validator(mode="after")
    def _consistent(self) -> Fp16Config:
        if not 0.0 < self.min_positive_val < self.max_finite_val <= FLOAT16_MAX:
            raise ValueError(f"need 0 < min_positive_val < max_finite_val <= {FLOAT16_MAX}; got "
                             f"min_positive_val={self.min_positive_val}, max_finite_val={self.max_finite_val}")
        if isinstance(self.tolerance, TaskTolerance) and self.mode != "auto":
            raise ValueError("a task-metric tolerance ({metric, max_drop}) is the target of budget mode: set "
                             "mode: auto (mode 'fixed' checks and repairs by output similarity)")
        if self.mode == "auto" and self.calibration is None:
            raise ValueError("mode 'auto' measures errors on data: set calibration: {data: <dataset>} "
                             "(the validation dataset is a good choice; data: null uses seeded random inputs)")
        return self

    def declared_tolerance(self) -> Tolerance | None:
        """The output limits of mode 'auto' and the fidelity check, which validation then holds the variant to."""
        return self.tolerance if isinstance(self.tolerance, Tolerance) else None

    def task_budget(self) -> TaskBudget | None:
        """Mode 'auto''s budget on a task metric, measured on its calibration data (which that mode needs)."""
        if not isinstance(self.tolerance, TaskTolerance) or self.calibration is None:
            return None
        return TaskBudget(self.tolerance, self.calibration.data, self.calibration.samples)

    def with_task_metric(self, metric: str) -> Fp16Config:
        if not isinstance(self.tolerance, TaskTolerance) or self.tolerance.metric is not None:
            return self
        return self.model_copy(update={"tolerance": self.tolerance.model_copy(update={"metric": metric})})


def reads_default_dataset(config: Fp16Config) -> bool:
    """Whether the stage, with this config, measures on the run's default dataset (validate.data) when it has one.

    The runner asks this (qdeploy.pipeline.recipe.registry) to put that dataset into the stage's cache key.
    """
    return config.calibration is None and config.use_validation_data


def effective_op_block_list(op_block_list: list[str] | None) -> list[str]:
    """The op types kept in float32: the config's list, or onnxconverter-common's default."""
    if op_block_list is not None:
        return list(op_block_list)
    from onnxconverter_common.float16 import DEFAULT_OP_BLOCK_LIST

    return list(DEFAULT_OP_BLOCK_LIST)
