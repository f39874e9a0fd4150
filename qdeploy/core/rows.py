"""Typed result rows: one validation (variant x target) and one benchmark (variant x target x batch size); and the
records a run's verdict is made of: a gate's result, a variant's failed build, a measurement that was not made.

The stages build these; the runner, gates, summary, sweeps, packages and the API read their attributes.  Each row
serializes with ``to_json()`` to exactly the keys report.json has always had, and ``from_json()`` parses such a dict
back (a report read from disk, a result handed between processes).

Some keys of report.json are written on every row (``reason``, ``metrics``...), others only on rows that were
measured (``outputs``, ``timed_call``...).  A field named in a model's ``OPTIONAL`` is written only when it was set,
by the constructor, ``replace`` or the parsed dict, so that absent stays absent and null stays null.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from qdeploy.core.errors import QdeployInputError

if TYPE_CHECKING:
    from typing_extensions import Self

__all__ = ["BenchmarkRow", "BenchmarkStatus", "BuildFailure", "FailureKind", "GateResult", "LatencyStats", "ResultRow",
           "StopRecord", "ThroughputRow", "UnmeasuredEntry", "UnmeasuredKind", "ValidationMetrics", "ValidationRow",
           "ValidationStatus", "benchmark_row_from_json", "readable_report", "rows_to_json"]

ValidationStatus = Literal["passed", "failed", "unavailable", "error", "unreadable"]
"""``unreadable``: the target cannot read the original model either, so nothing built from it runs there: a
limitation of the target (said once in ``unreadable_targets``), neither a pass nor a failure of the variant."""
BenchmarkStatus = Literal["ok", "unavailable", "error"]
FailureKind = Literal["input", "stage"]
UnmeasuredKind = Literal["validate", "benchmark"]


def _plain(value: Any) -> Any:
    """A row's value as JSON-ready data: nested rows serialized, containers copied."""
    if isinstance(value, ResultRow):
        return value.to_json()
    if isinstance(value, BaseModel):  # a section read with open models (qdeploy.core.layer_rows): keys as read
        return value.model_dump(exclude_unset=True)
    if isinstance(value, list | tuple):
        return [_plain(item) for item in value]
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    return value


class ResultRow(BaseModel):
    """Base of the result rows: unknown fields are errors, fields are read-only, optional keys stay absent."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    OPTIONAL: ClassVar[frozenset[str]] = frozenset()
    """Fields written to JSON only when set (report.json leaves them out on rows that were not measured)."""

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        unknown = cls.OPTIONAL - set(cls.model_fields)
        if unknown:
            raise TypeError(f"{cls.__name__}.OPTIONAL names no field: {sorted(unknown)}")

    def to_json(self) -> dict[str, Any]:
        """The row as report.json writes it."""
        return {name: _plain(getattr(self, name)) for name in type(self).model_fields
                if name not in self.OPTIONAL or name in self.model_fields_set}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Self:
        """Parse a row as report.json writes it; a key the model does not know is an error."""
        return cls.model_validate(dict(data))

    def has(self, name: str) -> bool:
        """Whether a field is present in the JSON form (always true for fields that are not optional)."""
        if name not in type(self).model_fields:
            raise AttributeError(f"{type(self).__name__} has no field '{name}'")
        return name not in self.OPTIONAL or name in self.model_fields_set

    def replace(self, **changes: Any) -> Self:
        """A copy with some fields changed, validated like a new row (an unknown field is an error)."""
        data = {name: getattr(self, name) for name in self.model_fields_set}
        return type(self).model_validate({**data, **changes})


class ValidationMetrics(ResultRow):
    """The worst value of each metric over a pair's outputs; empty when the pair was not measured."""

    OPTIONAL: ClassVar[frozenset[str]] = frozenset({
        "cosine", "snr_db", "max_abs_err", "mean_abs_err", "max_rel_err", "within_tol", "top1_agreement",
        "top5_agreement", "kl", "nonfinite", "task_metric", "detections_matched"})

    max_abs_err: float | None = None
    mean_abs_err: float | None = None
    max_rel_err: float | None = None
    cosine: float | None = None
    snr_db: float | None = None
    within_tol: float | None = None
    top1_agreement: float | None = None
    top5_agreement: float | None = None
    kl: float | None = None
    """Mean KL divergence per token of language-model logits (qdeploy.core.compare); present only for them."""
    nonfinite: int | None = None
    task_metric: float | None = None
    """The recipe's validate.metric on this pair's outputs (present only when the recipe sets one)."""
    detections_matched: float | None = None
    """The lower of a detection match's recall and precision (present only when validate.detections is set)."""

    @property
    def measured(self) -> bool:
        return bool(self.model_fields_set)

    def value(self, name: str) -> float | None:
        """One metric by its report name (a gate's ``metric``); an unknown name is an error."""
        if name not in type(self).model_fields:
            raise AttributeError(f"no validation metric '{name}'")
        return getattr(self, name)


class ValidationRow(ResultRow):
    """One artifact on one target against the reference outputs."""

    OPTIONAL: ClassVar[frozenset[str]] = frozenset({
        "outputs", "tolerance", "tolerance_basis", "precision", "execution", "samples",
        "batch_sizes_validated", "task_metric_reference", "task_metric_name", "task_metric_direction",
        "added", "precision_hint", "precision_attempts",
        "deploy_precision", "unreadable", "arbitrated"})

    variant: str
    target: str
    status: ValidationStatus
    reason: str = ""
    metrics: ValidationMetrics = Field(default_factory=ValidationMetrics)
    effective_precision: str | None = None
    warnings: list[str] = Field(default_factory=list)
    divergence: dict[str, Any] | None = None
    """The first node whose output breaks the limits (validate.localize), or None."""
    unattainable: list[str] = Field(default_factory=list)
    noise_floor: bool = False
    """True on the rows that run the reference itself on another target: they measure the noise floor."""
    # measured rows only
    outputs: list[dict[str, Any]] | None = None
    tolerance: dict[str, Any] | None = None
    tolerance_basis: str | None = None
    precision: str | None = None
    execution: dict[str, Any] | None = None
    samples: int | None = None
    batch_sizes_validated: list[int] | None = None
    task_metric_reference: float | None = None
    task_metric_name: str | None = None
    """The recipe's validate.metric ('file.py:function' or a built-in name such as 'perplexity')."""
    task_metric_direction: Literal["higher", "lower"] | None = None
    """Which way task_metric is better: 'lower' for perplexity (a rise is a drop), 'higher' otherwise."""
    added: str | None = None
    """Why qdeploy added this row to the recipe's matrix (the fp16 true-precision check)."""
    precision_hint: str | None = None
    """OpenVINO rows: the INFERENCE_PRECISION_HINT this row's numbers ran with ('f32', 'f16', 'bf16'); None: the
    device's default.  ``execution['precision']`` is what OpenVINO really compiled."""
    precision_attempts: list[dict[str, Any]] | None = None
    """OpenVINO rows the device default failed on a reduced-precision CPU: each setting tried, in order ('default'
    first, then pinned precisions), what ran, whether it passed, its metrics and its reason."""
    deploy_precision: str | None = None
    """Set when the device default missed the tolerance and this pinned precision holds: the row's numbers are the
    pinned run's, and the package pins INFERENCE_PRECISION_HINT to it."""
    unreadable: bool | None = None
    """True when the target cannot read or compile this artifact because it cannot read the original model either
    (the reference variant's row on that target, whose reason says why, once); the row's status is then
    ``unreadable``: not a failure of this variant, and never a pass.  report.json's ``unreadable_targets`` names each
    such target once."""
    arbitrated: dict[str, Any] | None = None
    """float32 rows off ort:cpu that failed against it: both runtimes against a float64 evaluation of the reference
    (``against``, ``samples``, ``verdict``: 'reference' when only ort:cpu misses the limits there, and the row then
    passes; 'target', 'both', 'neither', or 'unchecked' with ``reason``; ``target`` and ``reference``: each side's
    worst metrics and whether it held)."""

    @property
    def measured(self) -> bool:
        """Whether the outputs were compared (passed or failed), not unavailable or errored."""
        return self.status in ("passed", "failed")


class LatencyStats(ResultRow):
    """Latency statistics in milliseconds (throughput rows have no std and no interval)."""

    OPTIONAL: ClassVar[frozenset[str]] = frozenset({"std", "ci95_p50"})

    p50: float
    p90: float
    p99: float
    mean: float
    min: float
    max: float
    std: float | None = None
    ci95_p50: list[float] | None = None


class StopRecord(ResultRow):
    """Why a benchmark row stopped before its planned runs: its time budget was spent."""

    reason: str
    max_seconds: float
    runs: int
    planned_runs: int | None
    warmup_runs: int
    seconds_spent: float


class BenchmarkRow(ResultRow):
    """Latency of one artifact on one target and batch size, one request at a time."""

    OPTIONAL: ClassVar[frozenset[str]] = frozenset({
        "warmup", "warmup_ms", "threads", "mode", "timed_call", "measure", "settings", "data", "output_shapes",
        "round_runs", "ci95_rel_width", "stopped_early", "execution", "speedup", "speedup_range", "precision_hint",
        "machine_load", "speedup_vs_default", "speedup_vs_default_range", "decode", "round_group", "anchor"})

    variant: str
    target: str
    batch_size: int
    status: BenchmarkStatus
    reason: str = ""
    latency_ms: LatencyStats | None = None
    throughput_per_s: float | None = None
    runs: int = 0
    session_create_ms: float | None = None
    first_run_ms: float | None = None
    round_p50_ms: list[float] = Field(default_factory=list)
    noisy: bool | None = None
    memory: dict[str, Any] | None = None
    notes: list[str] = Field(default_factory=list)
    # measured rows only
    warmup: int | None = None
    warmup_ms: float | None = None
    threads: int | None = None
    mode: str | None = None
    timed_call: str | None = None
    measure: dict[str, Any] | None = None
    settings: dict[str, Any] | None = None
    data: dict[str, Any] | None = None
    output_shapes: dict[str, Any] | None = None
    round_runs: list[int] | None = None
    ci95_rel_width: float | None = None
    stopped_early: StopRecord | None = None
    execution: dict[str, Any] | None = None
    precision_hint: str | None = None
    """OpenVINO rows: the INFERENCE_PRECISION_HINT the timed runs used (None: the device default)."""
    machine_load: dict[str, Any] | None = None
    """How busy the machine was while this target was timed (other processes' cores, involuntary switches, load
    average, ``busy``) and the extra rounds that took (``qdeploy.stages.benchmark._machine``)."""
    round_group: int | None = None
    """Which group of sessions timed this row, where a target's artifacts did not fit in memory at once (the session
    budget) and were timed group after group; None: every artifact of the target and batch in the same rounds.
    Rows of two groups share no round: they are compared by their samples of rounds, never round by round."""
    anchor: dict[str, Any] | None = None
    """A later group's rows: ``variant`` (the first artifact, timed again in this group) and its ``round_p50_ms``
    in these very rounds; speedups against it pair round by round (``stages.benchmark._resident``)."""
    decode: dict[str, Any] | None = None
    """Language models with a KV cache: prefill ms, decode ms per token, tokens/s, cache length reached
    (``qdeploy.stages.benchmark._decode.DecodeRecordDict``); absent on other models."""
    # added by the report (qdeploy.pipeline.results.summary): against the reference variant on the same target and batch
    speedup: float | None = None
    speedup_range: list[float] | None = None
    speedup_vs_default: float | None = None
    """Against the reference run at the device's default precision (``fp32@default``) on targets that have that
    row: what a user who deploys the float32 file without quantizing gets."""
    speedup_vs_default_range: list[float] | None = None

    @property
    def p50(self) -> float | None:
        return self.latency_ms.p50 if self.latency_ms is not None else None


class ThroughputRow(ResultRow):
    """Inferences per second of one artifact on one target and batch size, many requests in flight."""

    OPTIONAL: ClassVar[frozenset[str]] = frozenset({
        "inferences", "requests_run", "seconds", "round_spread", "call", "settings", "speedup", "speedup_range",
        "precision_hint", "round_group", "anchor"})

    variant: str
    target: str
    batch_size: int
    mode: Literal["throughput"] = "throughput"
    status: BenchmarkStatus
    reason: str = ""
    inferences_per_s: float | None = None
    round_inferences_per_s: list[float] = Field(default_factory=list)
    requests_in_flight: int | None = None
    streams: int | None = None
    threads_per_request: int | None = None
    latency_ms: LatencyStats | None = None
    notes: list[str] = Field(default_factory=list)
    # measured rows only
    inferences: int | None = None
    requests_run: int | None = None
    seconds: float | None = None
    round_spread: float | None = None
    call: str | None = None
    settings: dict[str, Any] | None = None
    precision_hint: str | None = None
    """OpenVINO rows: the INFERENCE_PRECISION_HINT the requests used (None: the device default)."""
    round_group: int | None = None
    """As ``BenchmarkRow.round_group``."""
    anchor: dict[str, Any] | None = None
    """As ``BenchmarkRow.anchor``, with the anchor's ``round_inferences_per_s``."""
    speedup: float | None = None
    speedup_range: list[float] | None = None


class GateResult(ResultRow):
    """One of the recipe's gates against its measurement; a gate the run left out (--variant/--target) is skipped."""

    variant: str
    target: str
    metric: str
    min: float | None
    max: float | None
    batch_size: int
    value: float | None
    """The measured value; None when it could not be measured (``reason`` says why) or the gate was skipped."""
    passed: bool | None
    """None exactly when ``skipped``."""
    skipped: bool
    reason: str


class BuildFailure(ResultRow):
    """A variant whose build stopped at a stage: it has no artifact, so no validation or benchmark rows either."""

    variant: str
    stage: str
    reason: str
    kind: FailureKind
    """'input': the recipe or its data is wrong (the run exits 2); 'stage': the stage failed on this model."""


class UnmeasuredEntry(ResultRow):
    """A measurement the recipe asked for and did not get: an errored row, a latency that is not a number, a
    missing row.  A target this machine lacks is never one (its rows are unavailable, not unmeasured)."""

    OPTIONAL: ClassVar[frozenset[str]] = frozenset({"batch_size"})

    kind: UnmeasuredKind
    variant: str
    target: str
    reason: str
    batch_size: int | None = None
    """Benchmark entries only: validation is not per batch size."""
    allowed: bool
    """The recipe lets the run pass without it (``report.allow_unmeasured`` names its kind)."""

    @classmethod
    def of(cls, kind: UnmeasuredKind, variant: str, target: str, batch: int | None, reason: str,
           allowed: Collection[str]) -> Self:
        """An entry, allowed when ``allowed`` (the recipe's allow_unmeasured) names its kind."""
        sized = {"batch_size": batch} if kind == "benchmark" else {}
        return cls(kind=kind, variant=variant, target=target, reason=reason, **sized, allowed=kind in allowed)


def benchmark_row_from_json(data: Mapping[str, Any]) -> BenchmarkRow | ThroughputRow:
    """A benchmark stage row of either mode, told apart by ``mode``."""
    if data.get("mode") == "throughput":
        return ThroughputRow.from_json(data)
    return BenchmarkRow.from_json(data)


def rows_to_json(rows: list[Any]) -> list[dict[str, Any]]:
    return [row.to_json() for row in rows]


@contextmanager
def readable_report(label: str) -> Iterator[None]:
    """Rows of report ``label`` that their models reject (or that are not objects at all) become an input error
    naming the field (exit 2), never a traceback: a report.json is a file a user may have edited."""
    try:
        yield
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        raise QdeployInputError(f"{label}: report.json has a row qdeploy cannot read ({where}: {first['msg']}); "
                                "was it written by another version of qdeploy?") from None
    except (TypeError, ValueError, AttributeError, KeyError) as exc:
        raise QdeployInputError(f"{label}: report.json is not shaped as qdeploy writes it "
                                f"({type(exc).__name__}: {exc}); was it edited?") from None
