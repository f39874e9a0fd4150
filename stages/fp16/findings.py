"""What the fp16 stage found (report.json ``lineage[].findings`` of an fp16 step)."""

from __future__ import annotations

from typing import Any

from typing_extensions import NotRequired, TypedDict

from qdeploy.core.findings import Findings

__all__ = ["ActivationAnalysis", "CastRepairRecord", "ClampRecord", "Fp16Findings", "KeptNode", "LoadRepairRecord"]

# typing_extensions' TypedDict: pydantic validates these fields (and needs it before Python 3.12); every producer
# fills them with exactly these types, in this key order (the order the report holds them in)


class ActivationAnalysis(TypedDict):
    """The data the activation ranges were measured on (``activation_analysis``)."""

    data: str
    source: str
    samples: int
    safety_margin: float
    max_finite_val: float


class KeptNode(TypedDict):
    """A node kept float32 for its data (``kept_in_fp32[]``); the tensor and value that decided it when a range
    (``_activations.OverflowEntry``) or an Inf/NaN under emulation did."""

    node: str
    op_type: str
    reason: str
    tensor: NotRequired[str]
    abs_max: NotRequired[float | None]
    predicted: NotRequired[float]


class ClampRecord(TypedDict):
    """What the conversion clamped (``clamp``): the limits, how many values, the initializers most clamped."""

    min_positive_val: float
    max_finite_val: float
    clamped_values: int
    initializers: dict[str, int]
    max_relative_change: float
    initializers_not_listed: NotRequired[int]


class CastRepairRecord(TypedDict):
    """What the type repair changed (``repair``)."""

    casts_added: int
    redundant_casts_removed: int
    initializer_copies: dict[str, str]
    constant_copies: dict[str, str]
    type_attributes_rewritten: list[str]
    outputs_retyped: list[str]


class LoadRepairRecord(TypedDict):
    """Why ONNX Runtime did not load the first float16 model, the nodes kept float32 that make it load, the loads
    the search tried (``_loadable``), and whether it finished (False: stopped at its limit, maybe keeping more
    nodes than needed)."""

    error: str
    kept_float32: list[str]
    loads: int
    minimal: bool


class Fp16Findings(Findings):
    """Which nodes stayed float32 and why, what the conversion clamped and repaired, and how faithful it is.

    The per-reason maps are node -> why; ``budget`` and ``fidelity`` are report-only records of the search and
    of the emulated (and reference) checks."""

    keep_io_types: bool
    op_block_list: list[str]
    schema_float32_nodes: dict[str, str]
    schema_float32_inputs: list[str]
    normalization_float32_nodes: dict[str, str]
    integer_accumulator_float32_nodes: dict[str, str]
    scatter_reduction_float32_nodes: dict[str, str]
    constant_range_float32_nodes: dict[str, str]
    activation_analysis: str | ActivationAnalysis
    """The data the activation ranges were measured on, or why they were not ("not run: ...")."""
    kept_in_fp32: list[KeptNode]
    """Nodes kept float32 for their data: node, op type, reason."""
    budget: dict[str, Any] | None = None
    """The search for float32 nodes that meet the tolerance (mode auto, or a repair); absent when none ran.  Written
    once from the stage's typed budget (``_budget_targets.Fp16Budget``: the emulated ``Float32Choice`` and the
    engine's per-target ``TargetRecord``s); nothing reads it back."""
    fidelity: dict[str, Any] | None = None
    """The emulated check (``emulated``) and the reference evaluator's (``reference``); absent without data."""
    load_repair: LoadRepairRecord | None = None
    """Nodes kept float32 because ONNX Runtime did not load the model with them float16; absent when it did."""
    node_block_list: list[str]
    clamp: ClampRecord
    repair: CastRepairRecord
    cast_nodes: int
    float16_compute_nodes: int = 0
    """Nodes that read or write float16 (not Casts, Constants, Identities, Shapes): 0 when the artifact is the
    float32 model (every node kept float32; the stage warns)."""
    checker: str
    seconds: float
