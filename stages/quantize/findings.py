"""What the quantize stage found (report.json ``lineage[].findings`` of a quantize step), one model per mode.

``QuantizeFindings`` is the base of every mode's findings: ``PtqFindings`` and ``DynamicFindings`` (engine
qdeploy), ``NncfPtqFindings`` (ptq, engine nncf), ``LowerFindings`` and ``WeightOnlyFindings``.  The parts two
modes share are bases of their own: ``PreparedNotes`` (preparing the float model), ``CalibrationNotes`` (ptq's
calibration) and ``Int8Findings`` (the int8 kernels counted per target).  The accuracy budget's record is typed
too (``BudgetFindings``, its targets ``TargetRecord``: ``qdeploy.stages.accuracy_budget.findings``, the engine's).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import field_serializer

from qdeploy.core.findings import Findings
from qdeploy.stages.accuracy_budget.findings import BudgetFindings, TargetRecord, TargetStatus

__all__ = ["BudgetFindings", "CalibrationNotes", "DynamicFindings", "Int8Findings", "LowerFindings", "LoweringNotes",
           "NncfPtqFindings", "PreparedNotes", "PtqFindings", "QuantizeFindings", "TargetRecord", "TargetStatus",
           "WeightOnlyFindings"]


class QuantizeFindings(Findings):
    """Every mode's findings: the mode that built the artifact."""

    mode: Literal["ptq", "dynamic", "lower", "weight_only"]


class Int8Findings(QuantizeFindings):
    """What every int8 mode (ptq, dynamic, lower) reports of the model it wrote."""

    quantized_nodes: dict[str, int]
    """Op type -> nodes that run in integer (``_common.quantized_node_counts``)."""
    build_cpu_int8_path: str
    int8_saturation_warning: str | None = None
    int8_kernels: dict[str, dict[str, Any]]
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
    subgraphs_left_float: list[dict[str, Any]] | None = None


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


class _PostTraining(Int8Findings, PreparedNotes):
    """What ptq and dynamic (engine qdeploy) share."""

    smooth_quant: dict[str, Any] | None = None
    """SmoothQuant: the alpha, each smoothed activation with its MatMuls and range of s; under ``auto`` also
    ``search``: the grid, the samples scored on, each trial's alpha (null: no smoothing), error ratio, cosine and
    SNR, the chosen alpha and the seconds the search took."""
    op_types: list[str]
    reduce_range: dict[str, Any]
    """The 7-bit setting, the operand on 7 bits and why (ptq: and what comparing the two measured)."""
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
    reduce_range: dict[str, Any]
    excluded: list[str]
    compute_nodes: int


class LoweringNotes(Findings):
    """What ``lower.lower_model`` found: the part of the lower mode's findings that its rules decide."""

    lowered: dict[str, int]
    """Rule -> sites it lowered."""
    sites: list[dict[str, Any]]
    sites_not_listed: int
    refused: list[dict[str, Any]]
    inexact: dict[str, Any]
    """How many sites are not exact, and the largest difference (its tensor and step)."""


class LowerFindings(Int8Findings, LoweringNotes):
    """mode lower: the fake-quant sites lowered and their check on data."""

    mode: Literal["lower"] = "lower"
    note: str | None = None
    """Said when the model holds no fake quantization (it is unchanged)."""
    qdq_parameters_unshared: int | None = None
    verification: dict[str, Any]
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
    calibration: dict[str, Any] | None = None
    """The data gptq and ratio read ({data, samples}); null when nothing read data."""
    mixed: dict[str, Any] | None = None
    """ratio below 1: the sensitivity measure, each MatMul's score, those kept int8 and the int4 share reached."""
    blocks: dict[str, dict[str, Any]] | None = None
    """Weight -> the block it was quantized in where that is not ``group_size`` (``block_size``; null: int8 with
    one scale per output channel), the length of its quantized axis and why (``_weight_blocks``); absent when
    every weight has ``group_size``."""
