"""The accuracy budget's typed record: each target's verdict (``TargetRecord``) and the search's findings
(``BudgetFindings``), as report.json holds them under a stage's ``budget``.  The engine decides on its own typed
state, never by reading these back.  The dicts the records hold (a comparison, the tolerance, a front's points)
are TypedDicts, validated with them: each lists its producer's keys in the producer's order."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, field_serializer
from typing_extensions import TypedDict

from qdeploy.core.findings import Findings

__all__ = ["BudgetComparison", "BudgetFindings", "BudgetLimits", "ComparisonSummary", "FrontPointRecord",
           "FrontRecord", "KeptFloat", "Margin", "PhaseCost", "PhaseRecord", "RuntimeCost", "TargetRecord",
           "TargetStatus", "TimeBound", "TrialRecord"]

TargetStatus = Literal["confirmed", "missed", "unavailable"]


class ComparisonSummary(TypedDict, total=False):
    """One comparison as the report holds it: held to an output tolerance (``evaluate.summary``: ``cosine``,
    ``snr_db``, ``top1_agreement``, ``max_abs_err``, and ``detections_matched`` for a detector's boxes) or to a
    task metric (``task_metric.metric_summary``: ``metric``, ``reference_metric``, ``drop``, ``allowed_drop``);
    both write ``passed``, ``error_ratio`` (the error over the allowed error, null when infinite) and ``reasons``
    (the first three).  One record for both, its keys in the order either writes them, as the findings validate
    it."""

    passed: bool
    cosine: float | None
    snr_db: float | None
    top1_agreement: float | None
    max_abs_err: float | None
    detections_matched: float | None
    metric: float | None
    reference_metric: float | None
    drop: float | None
    allowed_drop: float | None
    error_ratio: float | None
    reasons: list[str]


class BudgetComparison(TypedDict, total=False):
    """A model's comparisons on the search samples and, when measured there, the held-back ones
    (``initial``, ``final``, a front point's ``task_or_error``)."""

    search: ComparisonSummary
    held_back: ComparisonSummary


class BudgetLimits(TypedDict, total=False):
    """The tolerance the budget holds (``tolerance``): an output ``Tolerance``'s or a ``TaskTolerance``'s limits
    that are set."""

    cosine_min: float
    snr_db_min: float
    atol: float
    rtol: float
    top1_agreement_min: float
    metric: str
    max_drop: float
    max_relative_drop: float
    metric_timeout_seconds: float


class FrontPointRecord(TypedDict, total=False):
    """One model of the latency-aware front (``front.points[]``, ``latency.Point.finding``)."""

    found_by: str
    kept_float: list[str]
    holds: bool
    task_or_error: BudgetComparison
    added_seconds_per_inference: dict[str, float]
    """Target -> seconds its float nodes add per inference."""
    recipe: dict[str, list[str]]
    """The recipe lines that build it: ``exclude_nodes``."""


class TargetRecord(BaseModel):
    """One target's verdict on the budget's model (``targets``).  The report holds the fields that were
    set, a set None included (a target runner that never reported its precision says ``precision: null``)."""

    model_config = ConfigDict(extra="forbid")

    status: TargetStatus
    reason: str | None = None
    """Why it is unavailable, why its runtime failed, or why the budget missed there."""
    search: ComparisonSummary | None = None
    """The comparison on the search samples (``evaluate.summary``)."""
    held_back: ComparisonSummary | None = None
    precision: str | None = None
    """The precision the target really ran (targets run through their adapter)."""
    measured_by: str | None = None
    deploy_precision: str | None = None
    """The pinned INFERENCE_PRECISION_HINT that holds, where the device default missed."""
    default: TargetRecord | None = None
    """The device default's missed record, beside the pinned one that holds."""
    note: str | None = None
    pinned: list[str] | None = None
    """What each pinned precision gave, when none held."""

    def to_report(self) -> dict[str, Any]:
        return self.model_dump(exclude_unset=True)


class _Record(BaseModel):
    """A typed part of the budget's findings; the report holds the fields that were set (a set None included)."""

    model_config = ConfigDict(extra="forbid")

    def to_report(self) -> dict[str, Any]:
        return self.model_dump(exclude_unset=True)


class Margin(_Record):
    """The error fraction the search held candidates to: the first round's, the last round's, the rounds run."""

    first_error_fraction: float | None = None
    error_fraction: float | None = None
    rounds: int | None = None


class TrialRecord(_Record):
    """One model the search measured (``tried``)."""

    phase: str
    float_nodes: int
    error_fraction: float | None = None
    """The fraction of the tolerance it was held to; absent for a confirmation on the held-back samples."""
    search_error_ratio: float | None = None
    task_metric: float | None = None
    passed: bool | None
    on: str


class PhaseRecord(_Record):
    """One search, on one set of runtimes (``phases``)."""

    searched_on: str
    met_there: bool
    kept_float: int
    margin: Margin
    missed_on: list[str]
    written: str | None = None

    @field_serializer("margin")
    def _margin(self, margin: Margin) -> dict[str, Any]:
        return margin.to_report()


class KeptFloat(_Record):
    """A node kept float: its rank, the error it adds, and why (``kept_float``)."""

    node: str
    op_type: str
    rank: int
    added_noise_to_signal: float | None
    reason: str
    error_ratio_rise_quantized_alone: float | None = None


class RuntimeCost(_Record):
    """What one runtime cost the budget (``runtimes``)."""

    evaluations: int
    seconds: float
    used_for: list[str]


class PhaseCost(_Record):
    """What one phase of the search cost (``cost``)."""

    evaluations: int
    seconds: float


class TimeBound(_Record):
    """The time bound in force (``time_bound``, ``clock``)."""

    seconds: float
    set_by: str
    first_evaluation_seconds: float | None = None
    rule: str | None = None


class FrontRecord(_Record):
    """Latency-aware reverting (``front``): the timing sources, the points (``latency.Point``) and the one chosen."""

    timing: dict[str, str]
    """Target -> how its costs were found ("measured: ...", "model: ...", "given")."""
    chosen_by: str | None = None
    points: list[FrontPointRecord]
    chosen: int | None


class BudgetFindings(Findings):
    """The accuracy budget's search (``search``): the samples, the model before and after, what was kept float,
    each target's verdict and what each runtime cost.  The search's own fields are absent when the fully
    quantized model held at once; ``note`` says why the budget missed."""

    tolerance: BudgetLimits
    samples: int
    search_samples: int
    held_back_samples: int
    initial: BudgetComparison
    """``search`` and ``held_back`` comparisons of the fully quantized model."""
    met: bool
    final: BudgetComparison
    kept_float: list[KeptFloat]
    """Nodes kept float, each with its rank and why."""
    candidates: int | None = None
    ranking: str | None = None
    margin: Margin | None = None
    phases: list[PhaseRecord] | None = None
    requantized: int | None = None
    tried: list[TrialRecord] | None = None
    targets: dict[str, TargetRecord]
    runtimes: dict[str, RuntimeCost]
    evaluations: int
    evaluation_seconds: float
    seconds: float
    confirmed: str
    note: str | None = None
    data: str | None = None
    """The budget's dataset ("random": seeded random data); set by the stage, which knows the recipe's name."""
    held_back_unseen_by_calibration: bool | None = None
    cost: dict[str, PhaseCost] | None = None
    """Phase -> evaluations and seconds (``clock``)."""
    max_seconds: float | None = None
    stopped: str | None = None
    """Where the time bound (``budget.max_seconds`` or the default) stopped the search; absent when it ran to its
    end."""
    time_bound: TimeBound | None = None
    """The bound in force: ``seconds``, ``set_by`` (budget.max_seconds or default), the first full evaluation's
    seconds and, for the default, its rule (``clock``)."""
    front: FrontRecord | None = None
    """Latency-aware reverting (``budget.weigh_latency``): the timing sources, the points and the one chosen."""

    @field_serializer("targets", "runtimes", "cost")
    def _by_name(self, records: dict[str, _Record | TargetRecord] | None) -> dict[str, dict[str, Any]] | None:
        return None if records is None else {name: record.to_report() for name, record in records.items()}

    @field_serializer("kept_float", "phases", "tried")
    def _in_order(self, records: list[_Record] | None) -> list[dict[str, Any]] | None:
        return None if records is None else [record.to_report() for record in records]

    @field_serializer("margin", "time_bound", "front")
    def _one(self, record: _Record | None) -> dict[str, Any] | None:
        return None if record is None else record.to_report()
