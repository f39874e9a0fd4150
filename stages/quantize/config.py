"""Settings of the quantize stage (a variant step's ``quantize`` settings); the recipe imports this module only.

One model per mode, chosen by ``mode`` (ptq when absent) as a discriminated union, ptq's by ``engine`` too:
``PtqConfig`` (engine qdeploy), ``NncfPtqConfig`` (engine nncf), ``DynamicConfig``, ``LowerConfig`` and
``WeightOnlyConfig``.  Each model holds only the fields its mode reads and forbids the others, naming the mode a
field applies to instead.  ``QuantizeConfig`` is what the registry, the recipe and the JSON schema use:
``QuantizeConfig.model_validate(settings)`` (or ``QuantizeConfig(**settings)``) returns the mode's model.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal, TypeVar, Union

from pydantic import (
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    TypeAdapter,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_core import InitErrorDetails

from qdeploy.core.stage_config import PerRuntime, StageConfig, TaskBudget
from qdeploy.core.tolerance import Tolerance
from qdeploy.stages.quantize._config_fields import (
    VERIFY_TARGETS,
    Budget,
    BudgetSettings,
    BudgetTolerance,
    Calibration,
    CalibrationRef,
    ExcludeNodes,
    ExcludeOpTypes,
    ExcludePatterns,
    NotForMode,
    OpTypes,
    PerChannel,
    ReduceRange,
    SymmetricWeights,
    TaskTolerance,
    VerifyTargets,
    WeightType,
)

__all__ = ["MODES", "STAGE", "VERIFY_TARGETS", "BudgetSettings", "CalibrationRef", "DynamicConfig", "LowerConfig",
           "ModeConfig", "NncfPtqConfig", "PtqConfig", "QuantizeConfig", "TaskTolerance", "WeightOnlyConfig"]

STAGE = "quantize"
MODES = ("ptq", "dynamic", "lower", "weight_only")
ENGINES = ("qdeploy", "nncf")


class _ModeSettings(StageConfig):
    """What every mode's model shares: its tag, and the refusal of another mode's fields by name."""

    model_config = ConfigDict(extra="forbid")

    label: ClassVar[str]
    """How errors name the model: its mode, and ptq's engine where it has one."""
    mode: str

    @model_validator(mode="before")
    @classmethod
    def _refuse_other_modes(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for key in data:
                if isinstance(key, str) and key not in cls.model_fields:
                    elsewhere = [member for member in _MEMBERS if key in member.model_fields]
                    if elsewhere:  # a known field in the wrong mode; an unknown one is pydantic's extra_forbidden
                        raise NotForMode(key, f"quantize.{cls.label} does not take '{key}' (it applies to "
                                               f"{_where(elsewhere, cls)}){_WHY.get(key, '')}")
        return data


SignedChoice = Literal["symmetric", "asymmetric", "measure"]


class PtqConfig(_ModeSettings):
    """mode ptq, engine qdeploy: static QDQ with activation ranges calibrated by qdeploy."""

    label: ClassVar[str] = "ptq"
    mode: Literal["ptq"] = Field(default="ptq", description="'ptq' (the default): static QDQ with calibrated "
                                                            "activation ranges.")
    calibration: Calibration = Field(default=None, description="Calibration data (seeded random data, 32 samples, "
                                                               "when absent).")
    method: Literal["minmax", "percentile", "entropy", "mse"] = Field(
        default="minmax", description="How activation ranges are estimated from the calibration data.")
    percentile: float = Field(default=99.999, gt=50.0, le=100.0,
                              description="Percentile of method 'percentile' (both tails for signed data).")
    per_channel: PerChannel = True
    activation_type: Literal["uint8", "int8"] = Field(
        default="uint8", description="Activation type; uint8 with int8 weights is what ORT fuses on x86. Under "
                                     "int8, what a Concat reads or writes stays uint8 wherever OpenVINO runs the "
                                     "graph (it miscomputes int8 there on VNNI CPUs without AMX; the report's "
                                     "signed_activations.uint8_at_concats says so).")
    weight_type: WeightType = "int8"
    symmetric_activations: bool = Field(default=False, description="Symmetric activation ranges.")
    signed_activations: Literal["auto", "asymmetric", "symmetric"] = Field(
        default="auto", description="How an activation whose calibrated range holds negative values is quantized "
                                    "when symmetric_activations is false: 'asymmetric' (activation_type with a "
                                    "zero point: the finest grid), 'symmetric' (int8, zero point 0, as NNCF does: "
                                    "OpenVINO's int8 kernels run 5-20% faster without an input zero point, at up "
                                    "to one bit less on lopsided ranges such as HardSwish's or SiLU's), auto (the "
                                    "default): in the build for OpenVINO (runtime: openvino), ranges nearly "
                                    "centred on zero go on int8, and lopsided ones too unless that graph is more "
                                    "than 1 dB SNR further from float32 on the calibration samples; asymmetric "
                                    "for ONNX Runtime. Activations that are never negative keep activation_type; "
                                    "beside 7-bit activations, signed ones stay uint8 unless only OpenVINO runs "
                                    "the graph (its per-runtime build, or OpenVINO targets only); what a Concat "
                                    "reads or writes stays uint8 (OpenVINO miscomputes int8 there on VNNI CPUs "
                                    "without AMX).")
    symmetric_weights: SymmetricWeights = True
    op_set: Literal["balanced", "onnxruntime"] = Field(
        default="balanced", description="Op types to quantize when op_types is absent: 'balanced' (compute, "
                                        "pooling, data movement; fast on ONNX Runtime and OpenVINO) or "
                                        "'onnxruntime' (ORT's full QDQ set, elementwise ops too: fastest on ORT "
                                        "for some models, slow on OpenVINO).")
    op_types: OpTypes = None
    exclude_nodes: ExcludeNodes
    exclude_op_types: ExcludeOpTypes
    exclude_patterns: ExcludePatterns
    tolerance: BudgetTolerance = None
    budget: Budget
    reduce_range: ReduceRange = "auto"
    engine: Literal["qdeploy"] = Field(
        default="qdeploy", description="Who builds the ptq model: qdeploy (ONNX Runtime's QDQ quantizer with "
                                       "qdeploy's calibration and placement); 'nncf': see mode ptq with engine nncf.")
    verify_targets: VerifyTargets
    smooth_quant: Annotated[float, Field(gt=0.0, lt=1.0)] | Literal["auto"] | None = Field(
        default=None,
        description="SmoothQuant's migration strength alpha (0.5 is the paper's default): divide each "
                    "MatMul/Gemm activation by per-channel s = max|x|^alpha / max|W|^(1-alpha), measured on the "
                    "calibration data, and multiply the constant weight by s, so that transformers' outlier "
                    "channels stop dominating the activation's int8 scale; auto: try alpha 0.3 to 0.8 (and no "
                    "smoothing) and keep the one closest to float32 on the budget's or calibration samples; "
                    "none: no smoothing.")
    per_runtime: Literal["auto"] | bool = Field(
        default="auto", description="One artifact per runtime among the recipe's targets, the variant 'v' "
                                    "becoming 'v@ort' and 'v@openvino', each with the placement that runtime "
                                    "runs fastest and validated, benchmarked and shipped on its own runtime's "
                                    "targets: true always; auto (the default) where the targets hold both runtimes "
                                    "and the two placements differ for the model (where they agree, both names "
                                    "are one build, one file measured once; OpenVINO targets only: the one graph "
                                    "shaped for OpenVINO); false: one graph for every target (docs/quantize.md).")
    runtime: Literal["ort", "openvino"] | None = Field(
        default=None, description="The runtime the graph is shaped for (set by per_runtime); none: one graph "
                                  "for both.")

    @field_validator("smooth_quant", mode="before")
    @classmethod
    def _alpha_or_auto(cls, value: Any) -> Any:
        # one clear message instead of pydantic's per-member union errors
        is_number = isinstance(value, int | float) and not isinstance(value, bool)
        if value is None or value == "auto" or (is_number and 0.0 < value < 1.0):
            return value
        raise ValueError(f"smooth_quant {value!r} must be 'auto' or an alpha strictly between 0 and 1 "
                         "(0.5 is SmoothQuant's default)")

    @model_validator(mode="after")
    def _consistent(self) -> PtqConfig:
        _check_budget_and_op_types(self)
        if self.activation_type == "int8" and self.weight_type == "uint8":
            raise ValueError("activation_type int8 with weight_type uint8 is not supported by ONNX Runtime; "
                             "use uint8 activations with int8 weights (x86) or int8 for both")
        if self.reduce_range == "activations" and self.activation_type != "uint8":
            raise ValueError(_ACTIVATIONS_NEED_UINT8)
        if self.method != "percentile" and self.percentile != type(self).model_fields["percentile"].default:
            raise ValueError("percentile applies to method 'percentile' only")
        if self.op_types is not None and self.op_set != "balanced":
            raise ValueError("give op_set or op_types, not both")
        if self.per_runtime is True and self.runtime is not None:
            raise ValueError(f"per_runtime: true builds one graph for each runtime of the targets, and runtime: "
                             f"{self.runtime} shapes the one graph for {self.runtime}: they contradict; keep "
                             "per_runtime (one graph each) or runtime (name the variant 'v@<runtime>' to run it on "
                             "that runtime's targets only)")
        return self

    def for_runtime(self, runtime: str) -> PtqConfig:
        """This config's build for one runtime (``per_runtime``'s split): shaped and verified for it only."""
        verify = [target for target in self.verify_targets if target.startswith(f"{runtime}:")]
        return type(self).model_validate({**self.model_dump(), "per_runtime": False, "runtime": runtime,
                                          "verify_targets": verify or [f"{runtime}:cpu"]})

    def signed_choice(self, runtime: str | None = None) -> SignedChoice:
        """``signed_activations`` resolved for the build for ``runtime`` (``self.runtime`` when not given):
        'symmetric', 'asymmetric', or 'measure' (build both, keep symmetric unless it costs accuracy)."""
        if self.symmetric_activations or self.signed_activations == "asymmetric":
            return "asymmetric"
        if self.signed_activations == "symmetric":
            return "symmetric"
        return "measure" if (runtime or self.runtime) == "openvino" else "asymmetric"

    def per_runtime_build(self) -> PerRuntime:
        """``per_runtime`` as the pipeline acts on it: auto only while no ``runtime`` pins the graph."""
        if self.per_runtime is True:
            return "always"
        return "auto" if self.per_runtime == "auto" and self.runtime is None else "never"

    def declared_tolerance(self) -> Tolerance | None:
        return _output_limits(self.tolerance)

    def task_budget(self) -> TaskBudget | None:
        return _task_budget(self.tolerance, self.budget.data or (self.calibration.data if self.calibration else None),
                            self.budget.samples)

    def with_task_metric(self, metric: str) -> PtqConfig:
        return _named_metric(self, self.tolerance, metric)


class NncfPtqConfig(_ModeSettings):
    """mode ptq, engine nncf: NNCF's nncf.quantize builds the QDQ model (its preset and range estimators decide
    what qdeploy's ptq settings would); qdeploy calibrates it on the same data, checks, validates and benchmarks."""

    label: ClassVar[str] = "ptq with engine nncf"
    mode: Literal["ptq"] = Field(default="ptq", description="'ptq'.")
    engine: Literal["nncf"] = Field(description="'nncf': NNCF's nncf.quantize (OpenVINO's tool; optional: pip "
                                                "install 'qdeploy[nncf]') builds the ptq model.")
    calibration: Calibration = Field(default=None, description="Calibration data (seeded random data, 32 samples, "
                                                               "when absent).")
    exclude_nodes: ExcludeNodes
    exclude_op_types: ExcludeOpTypes
    exclude_patterns: ExcludePatterns
    reduce_range: ReduceRange = "auto"
    nncf_model_type: Literal["transformer"] | None = Field(
        default=None, description="NNCF's model_type (transformer: its placement for attention models).")
    verify_targets: VerifyTargets


class DynamicConfig(_ModeSettings):
    """mode dynamic: weights quantized ahead, activations at run time (transformer encoders on CPU)."""

    label: ClassVar[str] = "dynamic"
    mode: Literal["dynamic"] = Field(description="'dynamic': weights quantized ahead, activations at run time.")
    per_channel: PerChannel = True
    weight_type: WeightType = "int8"
    symmetric_weights: SymmetricWeights = True
    op_types: OpTypes = None
    exclude_nodes: ExcludeNodes
    exclude_op_types: ExcludeOpTypes
    exclude_patterns: ExcludePatterns
    tolerance: BudgetTolerance = None
    budget: Budget
    reduce_range: ReduceRange = "auto"
    verify_targets: VerifyTargets

    @model_validator(mode="after")
    def _consistent(self) -> DynamicConfig:
        _check_budget_and_op_types(self)
        if self.reduce_range == "activations":
            raise ValueError(_ACTIVATIONS_NEED_UINT8)
        return self

    def quantizes_at_run_time(self) -> bool:
        return True

    def declared_tolerance(self) -> Tolerance | None:
        return _output_limits(self.tolerance)

    def task_budget(self) -> TaskBudget | None:
        return _task_budget(self.tolerance, self.budget.data, self.budget.samples)

    def with_task_metric(self, metric: str) -> DynamicConfig:
        return _named_metric(self, self.tolerance, metric)


class LowerConfig(_ModeSettings):
    """mode lower: fake-quant ops of a QAT model lowered to exact QuantizeLinear/DequantizeLinear."""

    label: ClassVar[str] = "lower"
    mode: Literal["lower"] = Field(description="'lower': fake-quant ops of a QAT model lowered to exact "
                                               "QuantizeLinear/DequantizeLinear.")
    calibration: Calibration = Field(default=None, description="The data the lowered model is verified on (8 "
                                                               "samples of seeded random data when absent).")
    verify_targets: VerifyTargets


class WeightOnlyConfig(_ModeSettings):
    """mode weight_only: int4 or int8 MatMul and embedding weights in blocks, activations float; calibration
    data only for method gptq, ratio below 1, awq and scale estimation."""

    label: ClassVar[str] = "weight_only"
    mode: Literal["weight_only"] = Field(description="'weight_only': int4 or int8 MatMul and embedding weights in "
                                                     "blocks, activations float (decoders, LLMs); calibration data "
                                                     "only for the data-aware settings.")
    bits: Literal[4, 8] = Field(default=4, description="Bits per weight.")
    group_size: int = Field(default=128, description="Weights per scale along the reduction axis: a power of two, "
                                                     "at least 16. A weight whose axis it does not divide gets the "
                                                     "largest power of two that does (at most 256 for MatMulNBits), "
                                                     "or int8 with a scale per channel when none does; the sidecar's "
                                                     "findings.blocks lists each.")
    symmetric_weights: SymmetricWeights = True
    lm_head: Literal["same", "int8", "float"] = Field(
        default="int8", description="The LM head (a MatMul whose output becomes a graph output through shape-only "
                                    "ops): the same bits as the rest, int8 (NNCF's default backup precision), or "
                                    "left float.")
    embeddings: Literal["same", "int8", "float"] = Field(
        default="same", description="Gather tables (embeddings): the same bits, int8, or float.")
    weight_format: Literal["matmulnbits", "dequantize_linear"] = Field(
        default="matmulnbits", description="Form of the weights: 'matmulnbits' (com.microsoft "
                                           "MatMulNBits/GatherBlockQuantized; ONNX Runtime and OpenVINO both run it "
                                           "with compressed weights) or 'dequantize_linear' (standard opset-21 "
                                           "blocked DequantizeLinear before each MatMul/Gather).")
    accuracy_level: Literal[0, 1, 2, 3, 4] = Field(
        default=4, description="MatMulNBits compute type on ONNX Runtime: 4 quantizes activations per block at run "
                               "time (the fast CPU path), 0 dequantizes weights to float (slower than float32 on "
                               "CPUs), 1 fp32, 2 fp16, 3 bf16.")
    method: Literal["rtn", "gptq"] = Field(
        default="rtn", description="How MatMul integers are chosen: 'rtn' rounds to nearest (no data); 'gptq' "
                                   "(GPTQ, as ORT's and NNCF's gptq) chooses them on calibration data to minimise "
                                   "the MatMul's output error. Embeddings are rounded to nearest either way.")
    act_order: bool = Field(
        default=False, description="method gptq only: rows in descending order of their input's mean square "
                                   "(GPTQ's desc_act), block scales fixed beforehand (static groups).")
    ratio: float = Field(default=1.0, gt=0.0, le=1.0, description="Share of the int4 MatMul weights (counted in "
                         "weights, NNCF's ratio) kept int4; the most sensitive MatMuls (ratio_sensitivity) become "
                         "int8. Needs bits 4.")
    ratio_sensitivity: Literal["max_variance", "output_error"] = Field(
        default="max_variance", description="What ratio ranks by: 'max_variance' (NNCF's data-aware default): the "
                                            "input's largest per-channel variance over a sample, divided by the "
                                            "weight's int8 noise; 'output_error': the MatMul's own output error "
                                            "that int4 adds over int8, per weight.")
    awq: bool = Field(
        default=False, description="Activation-aware scaling (AWQ): row scales rms(input)^alpha searched on "
                                   "calibration data; weights rounded as W*s, the input divided by s in a Mul.")
    scale_estimation: bool = Field(
        default=False, description="Fit each block's scale (and zero point) by least squares weighted by the "
                                   "input's mean square on calibration data, instead of the block's extremes.")
    zero_points: Literal["integer", "float"] = Field(
        default="integer", description="Zero points of asymmetric MatMul blocks: 'integer' (4 or 8 bits) or 'float' "
                                       "(a float32 per block, ORT's HQQ form of MatMulNBits). Needs "
                                       "symmetric_weights false and weight_format matmulnbits.")
    calibration: Calibration = Field(default=None, description="Data that method gptq, ratio below 1, awq and "
                                                               "scale_estimation read (32 samples of seeded random "
                                                               "data when absent).")
    op_types: OpTypes = None
    exclude_nodes: ExcludeNodes
    verify_targets: VerifyTargets

    @model_validator(mode="after")
    def _data_settings_fit(self) -> WeightOnlyConfig:
        if self.ratio < 1 and self.bits != 4:
            raise ValueError(f"ratio {self.ratio} splits int4 weights between int4 and int8: it needs bits 4, "
                             f"not {self.bits}")
        if (self.calibration is not None and self.method == "rtn" and self.ratio == 1 and not self.scale_estimation
                and not self.awq):
            raise ValueError("calibration is read only by method gptq, ratio below 1, scale_estimation or awq: set "
                             "one, or remove it")
        if self.ratio_sensitivity != "max_variance" and self.ratio >= 1:  # the default passes: dumps hold it
            raise ValueError("ratio_sensitivity ranks MatMuls for a ratio below 1: set ratio, or remove it")
        if self.awq and self.bits != 4:
            raise ValueError(f"awq scales int4 weights: it needs bits 4, not {self.bits}")
        if self.act_order and self.method != "gptq":
            raise ValueError(f"act_order orders GPTQ's walk over the rows: it needs method gptq, not {self.method}")
        if self.zero_points == "float" and (self.symmetric_weights or self.weight_format != "matmulnbits"):
            raise ValueError("zero_points 'float' is a MatMulNBits form of asymmetric blocks: it needs "
                             "symmetric_weights false and weight_format matmulnbits")
        return self

    @field_validator("group_size")
    @classmethod
    def _power_of_two(cls, value: int) -> int:
        if value < 16 or value & (value - 1):
            raise ValueError(f"group_size {value} must be a power of two, at least 16 (MatMulNBits, "
                             "GatherBlockQuantized and OpenVINO's grouped weights need that)")
        return value

    @field_validator("op_types")
    @classmethod
    def _matmul_and_gather(cls, op_types: list[str] | None) -> list[str] | None:
        if op_types is not None and not set(op_types) <= {"MatMul", "Gather"}:
            raise ValueError(f"mode 'weight_only' quantizes MatMul and Gather weights only; op_types "
                             f"{sorted(set(op_types) - {'MatMul', 'Gather'})} cannot be")
        return op_types


def _check_budget_and_op_types(config: PtqConfig | DynamicConfig) -> None:
    """What ptq and dynamic (qdeploy's quantizer) check alike: a budget has a tolerance that limits something, and
    no op type is both quantized and excluded."""
    if config.budget != BudgetSettings() and config.tolerance is None:
        raise ValueError("budget settings need a 'tolerance' to meet")
    if config.tolerance is not None and not config.tolerance.model_dump(exclude_none=True):
        raise ValueError("tolerance sets no limit: give cosine_min, top1_agreement_min or snr_db_min")
    if config.op_types is not None:
        overlap = sorted(set(config.op_types) & set(config.exclude_op_types))
        if overlap:
            raise ValueError(f"op types {overlap} are both in op_types and exclude_op_types")


_Budgeted = TypeVar("_Budgeted", PtqConfig, DynamicConfig)
"""The modes with an accuracy budget (``tolerance``, ``budget``)."""


def _output_limits(tolerance: Tolerance | TaskTolerance | None) -> Tolerance | None:
    """A budget's output limits (what validation then holds the variant to); None for a task-metric budget."""
    return tolerance if isinstance(tolerance, Tolerance) else None


def _task_budget(tolerance: Tolerance | TaskTolerance | None, data: str | None, samples: int) -> TaskBudget | None:
    return TaskBudget(tolerance, data, samples) if isinstance(tolerance, TaskTolerance) else None


def _named_metric(config: _Budgeted, tolerance: Tolerance | TaskTolerance | None, metric: str) -> _Budgeted:
    """``config`` with ``metric`` in its task-metric budget, where that names no metric."""
    if not isinstance(tolerance, TaskTolerance) or tolerance.metric is not None:
        return config
    return config.model_copy(update={"tolerance": tolerance.model_copy(update={"metric": metric})})


_ACTIVATIONS_NEED_UINT8 = ("reduce_range 'activations' needs mode ptq with activation_type uint8 (int8 activations "
                           "are shifted to uint8 by ONNX Runtime and would still saturate); use 'weights'")
_MEMBERS: tuple[type[_ModeSettings], ...] = (PtqConfig, NncfPtqConfig, DynamicConfig, LowerConfig, WeightOnlyConfig)
_WHY = {name: ": per_runtime and runtime shape qdeploy's ptq graph; mode weight_only builds one graph both runtimes "
              "run compressed, dynamic and lower graphs do not depend on the runtime, and engine nncf shapes its "
              "graph for OpenVINO itself" for name in ("per_runtime", "runtime")}
"""Why a field is refused outside its mode, where the mode names alone do not say it."""


def _where(members: list[type[_ModeSettings]], asking: type[_ModeSettings]) -> str:
    """'mode ptq', 'modes ptq and dynamic', 'mode ptq with engine nncf'...: where a field applies."""
    labels = [member.label for member in members]
    if "ptq" in labels and NncfPtqConfig.label in labels:
        labels.remove(NncfPtqConfig.label)  # both engines: the mode says it
    elif "ptq" in labels and asking is NncfPtqConfig:
        labels[labels.index("ptq")] = "ptq with engine qdeploy"
    if len(labels) == 1:
        return f"mode {labels[0]}"
    return f"modes {', '.join(labels[:-1])} and {labels[-1]}"


def _tag(data: Any) -> str:
    """The union member of some settings: ``mode`` (ptq when absent), and for ptq ``engine`` (qdeploy when absent)."""
    if isinstance(data, _ModeSettings):
        return "ptq/nncf" if isinstance(data, NncfPtqConfig) else data.mode
    if not isinstance(data, dict):
        return "ptq"  # not settings at all: ptq's model says what it wants
    mode, engine = data.get("mode", "ptq"), data.get("engine", "qdeploy")
    if mode != "ptq":
        return str(mode)
    return "ptq" if engine == "qdeploy" else f"ptq/{engine}"


ModeConfig = Annotated[
    Union[Annotated[PtqConfig, Tag("ptq")], Annotated[NncfPtqConfig, Tag("ptq/nncf")],  # noqa: UP007
          Annotated[DynamicConfig, Tag("dynamic")], Annotated[LowerConfig, Tag("lower")],
          Annotated[WeightOnlyConfig, Tag("weight_only")]],
    Discriminator(_tag),
]
"""The settings of one quantize step: the model of its mode."""
_ADAPTER: TypeAdapter[Any] = TypeAdapter(ModeConfig)
_TAGS = frozenset({"ptq", "ptq/nncf", "dynamic", "lower", "weight_only"})


class QuantizeConfig:
    """The quantize stage's settings, as the registry, the recipe and ``qdeploy schema`` see them: validating
    returns the model of the settings' mode (``ModeConfig``), errors located at the recipe's keys (never at the
    union's tag), the schema is one ``oneOf`` branch per mode."""

    def __new__(cls, **settings: Any) -> PtqConfig | NncfPtqConfig | DynamicConfig | LowerConfig | WeightOnlyConfig:  # type: ignore[misc]
        return cls.model_validate(settings)

    @classmethod
    def model_validate(cls, data: Any) -> PtqConfig | NncfPtqConfig | DynamicConfig | LowerConfig | WeightOnlyConfig:
        try:
            return _ADAPTER.validate_python(data)
        except ValidationError as exc:
            raise ValidationError.from_exception_data(cls.__name__, [_at_recipe_key(error, data)
                                                                  for error in exc.errors()]) from None

    @classmethod
    def model_json_schema(cls, **kwargs: Any) -> dict[str, Any]:
        return _ADAPTER.json_schema(**kwargs)

    members: ClassVar[tuple[type[_ModeSettings], ...]] = _MEMBERS
    """The models of the modes, as the docs list them."""


def _at_recipe_key(error: Any, data: Any) -> InitErrorDetails:
    """``error`` located where the user wrote the value: without the union's tag, a field of another mode at the
    field, an unknown mode or engine as a literal error at that key."""
    loc = tuple(error["loc"])
    if loc and loc[0] in _TAGS:
        loc = loc[1:]
    cause = (error.get("ctx") or {}).get("error")
    if isinstance(cause, NotForMode):
        loc = (*loc, cause.field)
    if error["type"] == "union_tag_invalid" and isinstance(data, dict):
        key = "mode" if data.get("mode", "ptq") != "ptq" else "engine"
        expected = MODES if key == "mode" else ENGINES
        return InitErrorDetails(type="literal_error", loc=(*loc, key), input=data.get(key),
                                ctx={"expected": _listed(expected)})
    return InitErrorDetails(type=error["type"], loc=loc, input=error["input"], ctx=error.get("ctx") or {})


def _listed(values: tuple[str, ...]) -> str:
    """"'a', 'b' or 'c'", as pydantic lists a literal's values."""
    quoted = [f"'{value}'" for value in values]
    return f"{', '.join(quoted[:-1])} or {quoted[-1]}"
