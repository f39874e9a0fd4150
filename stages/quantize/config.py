"""Settings of the quantize stage (a variant step's ``quantize`` settings); the recipe imports this module only."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from qdeploy.core.tolerance import Tolerance

__all__ = ["STAGE", "VERIFY_TARGETS", "BudgetSettings", "CalibrationRef", "QuantizeConfig"]


STAGE = "quantize"
VERIFY_TARGETS = ("ort:cpu", "openvino:cpu")
"""Targets a quantized artifact is loaded on before it is published (``verify_targets``'s default)."""
_FLOAT_TYPES = (1, 10, 11, 16)  # onnx float, float16, double, bfloat16


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


class QuantizeConfig(BaseModel):
    """Settings of the quantize stage."""

    model_config = ConfigDict(extra="forbid")

    mode: Literal["ptq", "dynamic", "lower", "weight_only"] = Field(
        default="ptq", description="'ptq': static QDQ with calibrated activation ranges; 'dynamic': weights "
                                   "quantized ahead, activations at run time; 'lower': fake-quant ops of a QAT "
                                   "model lowered to exact QuantizeLinear/DequantizeLinear; 'weight_only': int4 or "
                                   "int8 MatMul and embedding weights in blocks, activations float (decoders, "
                                   "LLMs), no calibration.")
    calibration: CalibrationRef | None = Field(
        default=None, description="Calibration data of ptq (seeded random data, 32 samples, when absent); in "
                                  "mode lower, the data the lowered model is verified on.")
    method: Literal["minmax", "percentile", "entropy", "mse"] = Field(
        default="minmax", description="How activation ranges are estimated from the calibration data (ptq).")
    percentile: float = Field(default=99.999, gt=50.0, le=100.0,
                              description="Percentile of method 'percentile' (both tails for signed data).")
    per_channel: bool = Field(default=True, description="Quantize weights per output channel.")
    activation_type: Literal["uint8", "int8"] = Field(
        default="uint8", description="Activation type of ptq; uint8 with int8 weights is what ORT fuses on x86.")
    weight_type: Literal["int8", "uint8"] = Field(default="int8", description="Weight type.")
    symmetric_activations: bool = Field(default=False, description="Symmetric activation ranges (ptq).")
    symmetric_weights: bool = Field(default=True, description="Symmetric weight ranges (zero point 0); OpenVINO "
                                                              "runs int8 convolutions only with symmetric weights.")
    op_set: Literal["balanced", "onnxruntime"] = Field(
        default="balanced", description="Op types ptq quantizes when op_types is absent: 'balanced' (compute, "
                                        "pooling, data movement; fast on ONNX Runtime and OpenVINO) or "
                                        "'onnxruntime' (ORT's full QDQ set, elementwise ops too: fastest on ORT "
                                        "for some models, slow on OpenVINO).")
    op_types: list[str] | None = Field(
        default=None, description="Op types to quantize, instead of op_set (dynamic: ORT's integer ops when "
                                  "absent, Conv left out with int8 weights: ORT has no int8-weight ConvInteger).")
    exclude_nodes: list[str] = Field(default_factory=list, description="Node names to leave in float.")
    exclude_op_types: list[str] = Field(default_factory=list, description="Op types whose nodes stay in float.")
    exclude_patterns: list[str] = Field(default_factory=list, description="Regular expressions; nodes whose name "
                                                                          "contains a match stay in float.")
    tolerance: Tolerance | None = Field(
        default=None, description="Accuracy budget against float32 (ptq, dynamic): the most harmful quantized "
                                  "nodes stay float until it holds.")
    budget: BudgetSettings = Field(default_factory=BudgetSettings, description="Data and limits of the accuracy "
                                                                               "budget's search.")
    reduce_range: bool | Literal["auto", "weights", "activations"] = Field(
        default="auto", description="Give up one bit so int8 computes exactly on x86 CPUs without VNNI, whose "
                                    "int8 kernels (vpmaddubsw) saturate with full-range values: 'weights' (or "
                                    "true) 7-bit weights, ONNX Runtime's reduce_range; 'activations' 7-bit uint8 "
                                    "activations (ptq, uint8 activations); false: full range, exact only on VNNI "
                                    "CPUs. 'auto': when a CPU target (ort:cpu, openvino:cpu, ort:openvino) is among "
                                    "the recipe's targets and weights are int8, ptq builds both 7-bit forms and "
                                    "keeps the one closer to float32 on calibration data, dynamic uses 7-bit "
                                    "weights; whatever CPU builds the artifact.")
    engine: Literal["qdeploy", "nncf"] = Field(
        default="qdeploy", description="Who builds the ptq model: qdeploy (ONNX Runtime's QDQ quantizer with "
                                       "qdeploy's calibration and placement) or NNCF's nncf.quantize (OpenVINO's "
                                       "tool; optional: pip install 'qdeploy[nncf]'), calibrated on the same data; "
                                       "either way qdeploy checks, validates and benchmarks the artifact.")
    nncf_model_type: Literal["transformer"] | None = Field(
        default=None, description="engine nncf: NNCF's model_type (transformer: its placement for attention models).")
    bits: Literal[4, 8] = Field(default=4, description="Bits per weight (mode weight_only).")
    group_size: int = Field(default=128, description="Weights per scale along the reduction axis (mode "
                                                     "weight_only): a power of two, at least 16.")
    lm_head: Literal["same", "int8", "float"] = Field(
        default="int8", description="The LM head (a MatMul whose output becomes a graph output through shape-only "
                                    "ops) in mode weight_only: the same bits as the rest, int8 (NNCF's default "
                                    "backup precision), or left float.")
    embeddings: Literal["same", "int8", "float"] = Field(
        default="same", description="Gather tables (embeddings) in mode weight_only: the same bits, int8, or float.")
    weight_format: Literal["matmulnbits", "dequantize_linear"] = Field(
        default="matmulnbits", description="Form of weight_only's weights: 'matmulnbits' (com.microsoft "
                                           "MatMulNBits/GatherBlockQuantized; ONNX Runtime and OpenVINO both run it "
                                           "with compressed weights) or 'dequantize_linear' (standard opset-21 "
                                           "blocked DequantizeLinear before each MatMul/Gather).")
    accuracy_level: Literal[0, 1, 2, 3, 4] = Field(
        default=4, description="MatMulNBits compute type on ONNX Runtime (weight_only): 4 quantizes activations "
                               "per block at run time (the fast CPU path), 0 dequantizes weights to float "
                               "(slower than float32 on CPUs), 1 fp32, 2 fp16, 3 bf16.")
    verify_targets: list[Literal["ort:cpu", "openvino:cpu"]] = Field(
        default_factory=lambda: list(VERIFY_TARGETS),
        description="Targets on which the stage counts the ops that really run int8 kernels.")
    smooth_quant: float | None = Field(
        default=None, gt=0.0, lt=1.0,
        description="ptq: SmoothQuant's migration strength alpha (0.5 is the paper's default): divide each "
                    "MatMul/Gemm activation by per-channel s = max|x|^alpha / max|W|^(1-alpha), measured on the "
                    "calibration data, and multiply the constant weight by s, so that transformers' outlier "
                    "channels stop dominating the activation's int8 scale; none: no smoothing.")
    per_runtime: bool = Field(
        default=False, description="ptq: build one artifact per runtime among the recipe's targets, the variant "
                                   "'v' becoming 'v@ort' and 'v@openvino', each with the placement that runtime "
                                   "runs fastest and validated and benchmarked on its own runtime's targets "
                                   "(docs/quantize.md).")
    runtime: Literal["ort", "openvino"] | None = Field(
        default=None, description="ptq: the runtime the graph is shaped for (set by per_runtime); none: one graph "
                                  "for both.")

    @field_validator("group_size")
    @classmethod
    def _power_of_two(cls, value: int) -> int:
        if value < 16 or value & (value - 1):
            raise ValueError(f"group_size {value} must be a power of two, at least 16 (MatMulNBits, "
                             "GatherBlockQuantized and OpenVINO's grouped weights need that)")
        return value

    @field_validator("exclude_patterns")
    @classmethod
    def _patterns_compile(cls, patterns: list[str]) -> list[str]:
        for pattern in patterns:
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ValueError(f"exclude_patterns: '{pattern}' is not a regular expression: {exc}") from None
        return patterns

    @model_validator(mode="after")
    def _consistent(self) -> QuantizeConfig:
        if self.activation_type == "int8" and self.weight_type == "uint8":
            raise ValueError("activation_type int8 with weight_type uint8 is not supported by ONNX Runtime; "
                             "use uint8 activations with int8 weights (x86) or int8 for both")
        # compared with the defaults, not model_fields_set: a dumped config is validated again by the runner
        if self.mode == "weight_only":
            self._only_defaults(_NOT_WEIGHT_ONLY)
            if self.op_types is not None and not set(self.op_types) <= {"MatMul", "Gather"}:
                raise ValueError(f"mode 'weight_only' quantizes MatMul and Gather weights only; op_types "
                                 f"{sorted(set(self.op_types) - {'MatMul', 'Gather'})} cannot be")
        else:
            self._only_defaults(_WEIGHT_ONLY)
        if (self.per_runtime or self.runtime) and (self.mode != "ptq" or self.engine != "qdeploy"):
            raise ValueError("per_runtime and runtime shape qdeploy's ptq graph; mode weight_only builds one graph "
                             "both runtimes run compressed, dynamic and lower graphs do not depend on the runtime, "
                             "and engine nncf shapes its graph for OpenVINO itself")
        if self.engine == "nncf":
            if self.mode != "ptq":
                raise ValueError(f"engine 'nncf' builds mode 'ptq' only, not '{self.mode}'")
            self._only_defaults(_NOT_NNCF, hint="engine 'qdeploy'")
        else:
            self._only_defaults(frozenset({"nncf_model_type"}), hint="engine 'nncf'")
        if self.mode in ("dynamic", "lower"):
            self._only_defaults(_PTQ_ONLY if self.mode == "dynamic" else (_PTQ_ONLY - {"calibration"}) | _NOT_LOWER)
        if self.reduce_range == "activations" and (self.mode != "ptq" or self.activation_type != "uint8"):
            raise ValueError("reduce_range 'activations' needs mode ptq with activation_type uint8 (int8 "
                             "activations are shifted to uint8 by ONNX Runtime and would still saturate); use "
                             "'weights'")
        if self.method != "percentile" and self.percentile != type(self).model_fields["percentile"].default:
            raise ValueError("percentile applies to method 'percentile' only")
        if self.budget != BudgetSettings() and self.tolerance is None:
            raise ValueError("budget settings need a 'tolerance' to meet")
        if self.tolerance is not None and not self.tolerance.model_dump(exclude_none=True):
            raise ValueError("tolerance sets no limit: give cosine_min, top1_agreement_min or snr_db_min")
        if self.op_types is not None and self.op_set != "balanced":
            raise ValueError("give op_set or op_types, not both")
        if self.op_types is not None:
            overlap = sorted(set(self.op_types) & set(self.exclude_op_types))
            if overlap:
                raise ValueError(f"op types {overlap} are both in op_types and exclude_op_types")
            if not self.op_types:
                raise ValueError("op_types is empty: name op types to quantize, or leave it out for ORT's default")
        return self

    def for_runtime(self, runtime: str) -> QuantizeConfig:
        """This config's build for one runtime (``per_runtime``'s split): shaped and verified for it only."""
        verify = [target for target in self.verify_targets if target.startswith(f"{runtime}:")]
        return type(self).model_validate({**self.model_dump(), "per_runtime": False, "runtime": runtime,
                                          "verify_targets": verify or [f"{runtime}:cpu"]})

    def _only_defaults(self, names: frozenset[str], hint: str | None = None) -> None:
        fields = type(self).model_fields
        explicit = sorted(name for name in names
                          if getattr(self, name) != (fields[name].default_factory() if fields[name].default_factory
                                                     else fields[name].default))
        if explicit:
            if hint is not None:
                raise ValueError(f"engine '{self.engine}' does not use {explicit}; remove them or use {hint}")
            hint = {"dynamic": "mode 'ptq'", "lower": "mode 'ptq' or 'dynamic'",
                    "weight_only": "mode 'ptq' or 'dynamic'"}.get(self.mode, "mode 'weight_only'")
            raise ValueError(f"mode '{self.mode}' does not use {explicit}; remove them or use {hint}")


_PTQ_ONLY = frozenset({"calibration", "method", "percentile", "activation_type", "symmetric_activations", "op_set",
                       "smooth_quant"})
_NOT_LOWER = frozenset({"per_channel", "weight_type", "symmetric_weights", "op_types", "exclude_nodes",
                        "exclude_op_types", "exclude_patterns", "tolerance", "budget", "reduce_range"})
_WEIGHT_ONLY = frozenset({"bits", "group_size", "lm_head", "embeddings", "weight_format", "accuracy_level"})
_NOT_WEIGHT_ONLY = _PTQ_ONLY | frozenset({"per_channel", "weight_type", "exclude_op_types", "exclude_patterns",
                                          "tolerance", "budget", "reduce_range"})
_NOT_NNCF = frozenset({"method", "percentile", "per_channel", "activation_type", "weight_type",
                       "symmetric_activations", "symmetric_weights", "op_set", "op_types", "tolerance", "budget",
                       "smooth_quant"})
"""Settings NNCF decides itself (its preset and range estimators) or qdeploy cannot give it."""
