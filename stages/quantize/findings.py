"""What the quantize stage found (report.json ``lineage[].findings`` of a quantize step), one model per mode.

``QuantizeFindings`` is the base of every mode's findings: ``PtqFindings`` and ``DynamicFindings`` (engine
qdeploy), ``NncfPtqFindings`` (ptq, engine nncf), ``LowerFindings`` and ``WeightOnlyFindings``.  The parts two
modes share are bases of their own: ``PreparedNotes`` (preparing the float model), ``CalibrationNotes`` (ptq's
calibration) and ``Int8Findings`` (the int8 kernels counted per target).  The accuracy budget's record is typed
too (``BudgetFindings``, its targets ``TargetRecord``: ``qdeploy.stages.accuracy_budget.findings``, the engine's).
The nested records the modes build as dicts are TypedDicts here (``KernelCount``, ``SmoothQuantRecord``,
``ReduceRangeRecord``...): the findings validate them, so each lists its producer's keys in the producer's order
with the value types it writes.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import field_serializer
from typing_extensions import NotRequired, TypedDict

from qdeploy.core.findings import Findings
from qdeploy.stages.accuracy_budget.findings import BudgetFindings, TargetRecord, TargetStatus

__all__ = ["ActivationMiss", "AlphaSearch", "AlphaTrial", "BudgetFindings", "CalibrationNotes", "DynamicFindings",
           "InexactSites", "Int8Findings", "KernelCount", "LowerFindings", "LoweringNotes", "LoweringVerification",
           "MixedPrecision", "NncfPtqFindings", "PreparedNotes", "PtqFindings", "QuantizeFindings", "ReduceRangeRecord",
           "RefusedSite", "SevenBitComparison", "SevenBitMeasure", "SmoothQuantRecord", "SmoothedTensor",
           "SubgraphLeftFloat", "TargetRecord", "TargetStatus", "WeightBlock", "WeightOnlyCalibration",
           "WeightOnlyDataFields", "WeightOnlyFindings"]


class KernelCount(TypedDict, total=False):
    """One target's int8 kernel count (``int8_kernels[target]``, ``ptq._verify.int8_kernels``), or why it was not
    counted."""

    status: str
    """Only when not counted: ``unavailable``, ``unchecked`` or ``error``, with the ``reason``."""
    reason: str
    quantizable: int
    """Compute nodes meant to run in int8 (``quantizable_nodes``)."""
    int8: int
    """Of them, those that run as int8 kernels or layers."""
    int8_kernels: dict[str, int]
    """ONNX Runtime: integer kernels of its optimized graph, by op type."""
    float_compute_kernels: dict[str, int]
    """ONNX Runtime: compute kernels left in float, by op type."""
    compute_layers: dict[str, int]
    """OpenVINO: compute layers of the compiled model, by type."""
    int8_layers: dict[str, int]
    """OpenVINO: those whose runtime precision is int8/uint8."""


class SubgraphLeftFloat(TypedDict):
    """A main-graph node that holds subgraphs, whose bodies stay float (``subgraphs_left_float[]``)."""

    node: str
    op_type: str
    body_nodes: int


class SmoothedTensor(TypedDict):
    """One smoothed activation (``smooth_quant.tensors[name]``): its MatMul/Gemm readers and the range of s."""

    nodes: list[str]
    max_scale: float
    min_scale: float


class AlphaTrial(TypedDict):
    """One alpha ``smooth_quant: auto`` tried (null: no smoothing) and how close its quantized model came."""

    alpha: float | None
    error_ratio: float | None
    cosine: float | None
    snr_db: float | None


class AlphaSearch(TypedDict):
    """``smooth_quant: auto``'s search (``smooth_quant.search``)."""

    grid: list[float]
    scored_on: str
    samples: int
    tolerance: dict[str, float]
    trials: list[AlphaTrial]
    chosen: float | None
    seconds: float


class SmoothQuantRecord(TypedDict, total=False):
    """What SmoothQuant did (``smooth_quant``): the alpha, the smoothed activations, the search under ``auto``."""

    alpha: float | None
    samples: int
    smoothed_tensors: int
    tensors: dict[str, SmoothedTensor]
    search: AlphaSearch
    note: str


class SevenBitMeasure(TypedDict):
    """One 7-bit form's fully quantized model against float32."""

    snr_db: float | None
    cosine: float | None


class SevenBitComparison(TypedDict):
    """What comparing 7-bit weights with 7-bit activations measured (``ptq._seven_bit.choose_seven_bit``)."""

    compared_on_samples: int
    measured: dict[str, SevenBitMeasure]
    margin_db: float
    """How much closer to float32 7-bit activations had to be to be chosen."""
    compared_tensors: NotRequired[list[str]]
    """The tensors measured instead of the outputs, which pass through an in-graph NMS (``graph.selection``)."""


class SignedActivationsRecord(TypedDict, total=False):
    """How activations that can be negative were quantized (``signed_activations``): the setting, which of them are
    int8 with zero point 0, why, and under auto what comparing both graphs measured (``ptq._signed``)."""

    setting: str
    symmetric: str
    """"none", "centred" (ranges nearly centred on zero) or "all"."""
    why: str
    compared_on_samples: int
    measured: dict[str, SevenBitMeasure]
    compared_tensors: list[str]
    """As ``SevenBitComparison.compared_tensors``."""
    uint8_at_concats: str
    """Under ``activation_type: int8`` where OpenVINO runs the graph: how many tensors a Concat reads or writes
    stayed uint8, and why."""
    uint8_before_moved_convs: str
    """Where OpenVINO runs the graph: how many int8 activation pairs before convolutions that read them through
    data movement were moved to uint8 (exact), and why (``ptq._concat_uint8``)."""


class ConvGemmRecord(TypedDict):
    """The int8 convolutions of a graph for ONNX Runtime given weight zero point -1 so that they run on its AMX
    GEMM rather than its symmetric convolution kernel (``ptq._amx_convs``): how many, which, and why."""

    convs: int
    names: list[str]
    why: str


class ReduceRangeRecord(TypedDict, total=False):
    """The 7-bit choice (``reduce_range``): the setting, the operand on 7 bits and why; NNCF's overflow fix, or
    what comparing both forms measured."""

    setting: bool | str
    seven_bit: str
    why: str
    nncf_overflow_fix: str
    compared_on_samples: int
    measured: dict[str, SevenBitMeasure]
    margin_db: float
    compared_tensors: list[str]
    """As ``SevenBitComparison.compared_tensors``."""


class RefusedSite(TypedDict):
    """A match a lowering rule's check (or its replacement) refused, and why (``refused[]``)."""

    rule: str
    nodes: list[str]
    reason: str


class InexactSites(TypedDict):
    """How many lowered sites are not exact, and the largest difference with its tensor and step (``inexact``)."""

    count: int
    largest_difference: float
    tensor: str | None
    step: float | None


class ActivationMiss(TypedDict):
    """A lowered activation farther from its fake-quant reference than one step (``lower.verify_on_data``)."""

    tensor: str
    rule: str
    max_error: float
    step: float
    reported_difference: float


class LoweringVerification(TypedDict, total=False):
    """The lowered activations checked on data (``verification``) and the data they ran on."""

    samples: int
    checked: int
    max_error_steps: float
    failures: list[ActivationMiss]
    note: str
    data: str


class WeightBlock(TypedDict):
    """The block a weight was quantized in where that is not ``group_size`` (``blocks[weight]``)."""

    block_size: int | None
    axis: int
    why: str


class MixedPrecision(TypedDict):
    """What ``ratio`` below 1 measured and chose (``mixed``)."""

    ratio: float
    int4_share: float
    sensitivity: str
    kept_int8: list[str]
    scores: dict[str, float]


class WeightOnlyCalibration(TypedDict):
    """The data gptq, ratio and scale estimation read (``calibration``)."""

    data: str
    samples: int
    statistics_reused: bool
    """Its statistics came from the run's cache: another variant (or run) computed them on the same model and data."""


class AwqSearch(TypedDict):
    """One input the awq search looked at (``awq``): the MatMuls reading it, the alpha kept (0: not scaled), the
    round-to-nearest output error on calibration data against no scaling."""

    matmuls: list[str]
    alpha: float
    error_ratio: float


class WeightOnlyDataFields(TypedDict, total=False):
    """The weight_only findings' fields about the method and the data (``weight_only._data.data_findings``)."""

    method: str
    scale_estimation: bool
    awq: dict[str, AwqSearch] | None
    zero_points: str
    calibration: WeightOnlyCalibration
    mixed: MixedPrecision | None


class QuantizeFindings(Findings):
    """Every mode's findings: the mode that built the artifact."""

    mode: Literal["ptq", "dynamic", "lower", "weight_only"]


class Int8Findings(QuantizeFindings):
    """What every int8 mode (ptq, dynamic, lower) reports of the model it wrote."""

    quantized_nodes: dict[str, int]
    """Op type -> nodes that run in integer (``_common.quantized_node_counts``)."""
    build_cpu_int8_path: str
    int8_saturation_warning: str | None = None
    int8_kernels: dict[str, KernelCount]
    """Target -> quantizable compute nodes and int8 kernels there, or why it was not checked."""


class PreparedNotes(Findings):
    """What preparing the float model did (``_prepare.prepare``); part of the ptq and dynamic findings."""

    preprocess: str
    """"complete", or "partly: " and the steps that failed."""
    constants_lifted: int
    nodes_named: int
    gemm_bias_vectorized: int | None = None
    gemm_bias_moved_to_add: int | None = None
    opset: str | None = None
    """How the opset was raised, when it was."""
    half_precision: str | None = None
    """A float16 or bfloat16 model made float32 inside before quantizing, when it was."""
    subgraphs_left_float: list[SubgraphLeftFloat] | None = None
    empty_concat_inputs_dropped: int | None = None
    """Concat inputs of length 0 dropped before quantizing (simplify's ``drop_empty_concat_inputs``)."""


class CalibrationNotes(Findings):
    """What ptq's calibration did (engine qdeploy)."""

    method: str
    percentile: float | None = None
    """Method percentile's percentile; absent for the other methods."""
    calibration_data: str
    calibration_samples: int
    calibrated_tensors: int
    ranges_clipped: int
    calibration_skipped: list[int] | None = None
    """Calibration samples held back for the budget's confirmation."""
    float_concats: dict[str, float] | None = None
    """Concats left float because one scale would leave their narrowest input fewer than 16 of 256 levels on the
    union of their inputs' ranges: node -> those levels (``ptq/_mixed_concats.py``)."""
    per_channel_depthwise: list[str] | None = None
    """Where OpenVINO runs the graph: the depthwise convolutions whose input is rescaled to one scale per channel in
    effect, because one scale for the tensor left a channel fewer than 16 levels (``ptq/_depthwise.py``)."""
    shape_computed: list[str] | None = None
    """Nodes left float because they write or read float values computed from the inputs' shapes alone (a dynamic
    export's anchor grid or strides: exact positions, not activations; ``qdeploy/graph/shape_values.py``)."""
    nonfinite_float: dict[str, str] | None = None
    """Nodes left float because they read or write +-Inf or NaN in calibration, or read a constant holding one (a
    mask): node -> that tensor (``ptq/_nonfinite.py``)."""


class _PostTraining(Int8Findings, PreparedNotes):
    """What ptq and dynamic (engine qdeploy) share."""

    smooth_quant: SmoothQuantRecord | None = None
    """SmoothQuant: the alpha, each smoothed activation with its MatMuls and range of s; under ``auto`` also
    ``search``: the grid, the samples scored on, each trial's alpha (null: no smoothing), error ratio, cosine and
    SNR, the chosen alpha and the seconds the search took."""
    op_types: list[str]
    reduce_range: ReduceRangeRecord
    """The 7-bit setting, the operand on 7 bits and why (ptq: and what comparing the two measured)."""
    signed_activations: SignedActivationsRecord | None = None
    """ptq: whether activations that can be negative are int8 with zero point 0, and why."""
    ort_conv_gemm: ConvGemmRecord | None = None
    """ptq for ONNX Runtime on an AMX CPU: the convolutions routed to its AMX GEMM."""
    budget: BudgetFindings | None = None
    excluded: list[str]
    activation_type: str
    weight_type: str
    per_channel: bool
    symmetric: dict[str, bool]
    compute_nodes: int

    @field_serializer("budget")
    def _budget(self, budget: BudgetFindings | None) -> dict[str, Any] | None:
        return None if budget is None else budget.to_report()


class PtqFindings(_PostTraining, CalibrationNotes):
    """mode ptq, engine qdeploy."""

    mode: Literal["ptq"] = "ptq"


class DynamicFindings(_PostTraining):
    """mode dynamic."""

    mode: Literal["dynamic"] = "dynamic"


class NncfPtqFindings(Int8Findings):
    """mode ptq, engine nncf."""

    mode: Literal["ptq"] = "ptq"
    engine: Literal["nncf"] = "nncf"
    nncf_version: str
    calibration_data: str
    calibration_samples: int
    model_type: str
    reduce_range: ReduceRangeRecord
    excluded: list[str]
    compute_nodes: int
    uint8_at_concats: str | None = None
    """Where OpenVINO runs the graph: int8 activation pairs at Concats, and before convolutions that read them
    through data movement, moved to uint8 (exact), and why."""
    per_tensor_depthwise: list[str] | None = None
    """The depthwise convolutions whose per-channel input pair (NNCF's) was rewritten as a rescaling Mul and one
    scale, which ONNX Runtime can run (``stages/quantize/ptq/_depthwise.py``)."""
    half_precision: str | None = None
    """A float16 or bfloat16 model made float32 inside before NNCF quantized it, when it was."""


class LoweringNotes(Findings):
    """What ``lower.lower_model`` found: the part of the lower mode's findings that its rules decide."""

    lowered: dict[str, int]
    """Rule -> sites it lowered."""
    sites: list[dict[str, Any]]
    """Each site's record (``lower._base.SiteRecord``); left a plain dict here: the rules write its keys in
    different orders, which validating it as a TypedDict would reorder."""
    sites_not_listed: int
    refused: list[RefusedSite]
    inexact: InexactSites
    """How many sites are not exact, and the largest difference (its tensor and step)."""


class LowerFindings(Int8Findings, LoweringNotes):
    """mode lower: the fake-quant sites lowered and their check on data."""

    mode: Literal["lower"] = "lower"
    note: str | None = None
    """Said when the model holds no fake quantization (it is unchanged)."""
    qdq_parameters_unshared: int | None = None
    uint8_at_concats: str | None = None
    """Where OpenVINO runs the graph: int8 activation pairs at Concats, and before convolutions that read them
    through data movement, moved to uint8 (exact), and why."""
    verification: LoweringVerification
    """The lowered activations against their fake-quant reference (``lower.verify_on_data``) and the data."""


class WeightOnlyFindings(QuantizeFindings):
    """mode weight_only."""

    mode: Literal["weight_only"] = "weight_only"
    bits: int
    group_size: int
    symmetric: bool
    weight_format: str
    accuracy_level: int | None
    """MatMulNBits' accuracy_level; null for the other weight format."""
    quantized_weights: dict[str, int]
    """"<op> int<bits>" -> weights quantized."""
    kept_float: dict[str, str]
    """Node -> why its weight stayed float."""
    bytes: dict[str, int]
    method: str = "rtn"
    """How MatMul integers were chosen: rtn or gptq."""
    scale_estimation: bool = False
    """Block scales (and zero points) fitted by weighted least squares (``weight_only._scales``)."""
    awq: dict[str, AwqSearch] | None = None
    """Input -> what the awq search found for the int4 MatMuls reading it (``weight_only._awq``); null without awq."""
    zero_points: str = "integer"
    """Zero points of asymmetric 4-bit MatMul blocks: integer or float."""
    calibration: WeightOnlyCalibration | None = None
    """The data gptq, ratio and scale estimation read ({data, samples, statistics_reused}); null when nothing read
    data."""
    mixed: MixedPrecision | None = None
    """ratio below 1: the sensitivity measure, each MatMul's score, those kept int8 and the int4 share reached."""
    blocks: dict[str, WeightBlock] | None = None
    """Weight -> the block it was quantized in where that is not ``group_size`` (``block_size``; null: int8 with
    one scale per output channel), the length of its quantized axis and why (``_weight_blocks``); absent when
    every weight has ``group_size``."""
