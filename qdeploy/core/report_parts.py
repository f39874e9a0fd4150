"""The parts of report.json beside its result rows: the recipe and model it ran, the machine, the artifacts with
their lineage, the verdict, the packages (``qdeploy.core.report.Report`` holds them).

Like the rows (``qdeploy.core.rows``), each part is frozen, rejects unknown keys, and writes exactly the keys
report.json has: a field named in ``OPTIONAL`` is written only when it was set, so a report from an older qdeploy
that lacks a key reads back without it.  What a stage found and how it was configured (``LineageStep.findings``
and ``config``) are open JSON objects: their shape is the stage's, declared by its findings and config models.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field

from qdeploy.core.rows import ResultRow

__all__ = [
    "ArtifactRecord",
    "CheckDataRecord",
    "Cpu",
    "Environment",
    "ExecutionRecord",
    "ExternalFile",
    "Int8PathRecord",
    "LineageStep",
    "ModelIdentity",
    "NoiseFloor",
    "NoiseFloorTarget",
    "PackageFailure",
    "PackageWritten",
    "Packages",
    "PerRuntimeNote",
    "RecipeRecord",
    "Reference",
    "TargetVerdictRecord",
    "TensorSignature",
    "TestedVersions",
    "VerdictChoice",
    "VerdictSection",
    "VersionDifference",
]



class RecipeRecord(ResultRow):
    """Which recipe ran: its name, file, and a short hash per section (``content``: of what its paths point at)."""

    OPTIONAL: ClassVar[frozenset[str]] = frozenset({"content"})

    name: str
    path: str | None = None
    sections: dict[str, str] = Field(default_factory=dict)
    content: dict[str, str] | None = None


class ExternalFile(ResultRow):
    """An external data file of a model: its name beside the model and its sha256."""

    OPTIONAL: ClassVar[frozenset[str]] = frozenset({"size_bytes"})

    file: str
    sha256: str
    size_bytes: int | None = None


class TensorSignature(ResultRow):
    """One model input or output: name, element type, shape (symbolic dimensions as names)."""

    name: str
    type: str
    shape: list[int | str | None] | None = None


class ModelIdentity(ResultRow):
    """The exported model's identity and signature, so that runs of different models are told apart."""

    OPTIONAL: ClassVar[frozenset[str]] = frozenset({"exported_sha256", "exported_key", "external_data", "inputs",
                                                    "outputs"})

    exported_sha256: str | None = None
    exported_key: str | None = None
    external_data: list[ExternalFile] = Field(default_factory=list)
    inputs: list[TensorSignature] = Field(default_factory=list)
    outputs: list[TensorSignature] = Field(default_factory=list)


class Cpu(ResultRow):
    model: str
    cores: int
    flags: dict[str, bool] = Field(default_factory=dict)


class Int8PathRecord(ResultRow):
    """The int8 path this CPU takes (``qdeploy.targets.int8_path``) and what it means per CPU target."""

    kind: str
    exact: bool
    meaning: str
    flags_source: str
    targets: dict[str, str] = Field(default_factory=dict)


class VersionDifference(ResultRow):
    installed: str | None
    tested: str | None


class TestedVersions(ResultRow):
    """Whether the runtimes are the versions qdeploy was tested with, and those that are not."""

    match: bool
    differ: dict[str, VersionDifference] = Field(default_factory=dict)


class Environment(ResultRow):
    """The machine and libraries that made the run."""

    OPTIONAL: ClassVar[frozenset[str]] = frozenset({"int8_path", "tested_versions", "platform"})

    python: str
    platform: str | None = None
    versions: dict[str, str | None] = Field(default_factory=dict)
    cpu: Cpu
    targets: dict[str, str] = Field(default_factory=dict)
    """Every known target -> 'available' or 'unavailable: <why>'."""
    available_targets: list[str] = Field(default_factory=list)
    int8_path: Int8PathRecord | None = None
    tested_versions: TestedVersions | None = None


class Reference(ResultRow):
    variant: str
    target: str


class LineageStep(ResultRow):
    """One step of an artifact's chain: its cache key, stage, cache state, time, config and findings."""

    OPTIONAL: ClassVar[frozenset[str]] = frozenset({"key", "cached", "cache", "seconds", "config", "findings"})

    stage: str
    key: str | None = None
    cached: bool | None = None
    cache: str | None = None
    """'hit', 'built' or 'rebuilt: <why>' (reports before cache notes lack it)."""
    seconds: float | None = None
    config: dict[str, Any] | None = None
    """The step's settings as the recipe gave them: open here, each stage's model reads them."""
    findings: dict[str, Any] | None = None
    """The stage's own findings: open here, their models live with the stage."""


class PerRuntimeNote(ResultRow):
    """``per_runtime: auto``: how many graphs a variant became for its runtimes, and why."""

    graphs: int
    differs_at: int
    nodes: list[str] = Field(default_factory=list)
    decision_seconds: float
    note: str


class ArtifactRecord(ResultRow):
    """A published artifact: where it is, its hashes, and how it was made."""

    OPTIONAL: ClassVar[frozenset[str]] = frozenset({
        "sidecar", "sidecar_sha256", "external_data", "size_bytes", "parent", "stages", "cached", "cache", "seconds",
        "key", "lineage", "per_runtime", "same_file_as"})

    name: str
    path: str
    sha256: str
    sidecar: str | None = None
    sidecar_sha256: str | None = None
    external_data: list[ExternalFile] = Field(default_factory=list)
    size_bytes: int | None = None
    parent: str | None = None
    stages: list[str] = Field(default_factory=list)
    cached: bool | None = None
    cache: str | None = None
    seconds: float | None = None
    key: str | None = None
    lineage: list[LineageStep] = Field(default_factory=list)
    per_runtime: PerRuntimeNote | None = None
    same_file_as: str | None = None
    """The variant whose file this one is, byte for byte (evaluated once, reported for both)."""

    def chain(self) -> str:
        """'export → simplify (cached) → fp16'."""
        return " → ".join(f"{step.stage}{' (cached)' if step.cached else ''}" for step in self.lineage)


class NoiseFloorTarget(ResultRow):
    max_abs_err: float | None
    mean_abs_err: float | None
    cosine: float | None
    snr_db: float | None
    status: str


class NoiseFloor(ResultRow):
    """The reference's own disagreement between ort:cpu and each other target.  Reports written before the floor
    was kept per target hold the metrics alone (``max_abs_err``, ``cosine``...), and no ``targets``."""

    OPTIONAL: ClassVar[frozenset[str]] = frozenset({"against", "variant", "targets", "max_abs_err", "mean_abs_err",
                                                    "cosine", "snr_db"})

    against: str | None = None
    variant: str | None = None
    targets: dict[str, NoiseFloorTarget] | None = None
    max_abs_err: float | None = None
    mean_abs_err: float | None = None
    cosine: float | None = None
    snr_db: float | None = None


class ExecutionRecord(ResultRow):
    """What ran for a verdict's pick (``qdeploy.pipeline.report.precision.execution_record``)."""

    OPTIONAL: ClassVar[frozenset[str]] = frozenset({"provider_kernels", "validated"})

    precision: str | None
    ran: str
    runtime: str | None
    providers: list[str] = Field(default_factory=list)
    kernels: dict[str, int] = Field(default_factory=dict)
    float32_only: bool = False
    provider_kernels: dict[str, int] | None = None
    validated: str | None = None


class VerdictChoice(ResultRow):
    """A variant as the verdict speaks of it: its latency and throughput figures, fidelity, size, what ran."""

    OPTIONAL: ClassVar[frozenset[str]] = frozenset({
        "latency_ms", "ci95_ms", "speedup", "speedup_range", "noisy", "speedup_vs_default", "speedup_vs_default_range",
        "inferences_per_s", "requests_in_flight", "latency_at_load_ms", "throughput_speedup", "deploy_precision",
        "execution", "decode_ms_per_token"})

    variant: str
    latency_ms: float | None = None
    """The timed row's median latency (of a model with a KV cache: its prefill call)."""
    decode_ms_per_token: float | None = None
    """Where the target ranks by decode: the decode ms per token that ranked it (``speedup`` is then decode's)."""
    ci95_ms: list[float] | None = None
    speedup: float | None = None
    speedup_range: list[float] | None = None
    noisy: bool | None = None
    speedup_vs_default: float | None = None
    speedup_vs_default_range: list[float] | None = None
    inferences_per_s: float | None = None
    requests_in_flight: int | None = None
    latency_at_load_ms: float | None = None
    throughput_speedup: float | None = None
    fidelity: dict[str, float | None] = Field(default_factory=dict)
    size_bytes: int | None = None
    deploy_precision: str | None = None
    execution: ExecutionRecord | None = None


class TargetVerdictRecord(VerdictChoice):
    """What to ship on one target: the pick's figures (``variant`` None when nothing qualifies), why, the
    runner-up, and every other variant with its reason."""

    OPTIONAL: ClassVar[frozenset[str]] = VerdictChoice.OPTIONAL | frozenset({"decided", "undecided", "fidelity",
                                                                              "size_bytes"})

    status: Literal["ship", "none"] = "none"
    variant: str | None = None  # type: ignore[assignment]
    why: str = ""
    decided: bool | None = None
    undecided: str | None = None
    fidelity: dict[str, float | None] | None = None  # type: ignore[assignment]
    size_bytes: int | None = None
    runner_up: VerdictChoice | None = None
    rejected: dict[str, str] = Field(default_factory=dict)


class VerdictSection(ResultRow):
    """Per available target what to ship, the targets this machine lacks, and those that cannot read the model."""

    OPTIONAL: ClassVar[frozenset[str]] = frozenset({"tie_break"})

    by: Literal["latency", "decode", "throughput", "size"]
    batch_size: int | None
    tie_break: str | None = None
    targets: dict[str, TargetVerdictRecord] = Field(default_factory=dict)
    order: list[str] = Field(default_factory=list)
    unavailable: dict[str, str] = Field(default_factory=dict)
    unreadable: dict[str, str] = Field(default_factory=dict)


class PackageWritten(ResultRow):
    OPTIONAL: ClassVar[frozenset[str]] = frozenset({"manifest_sha256"})

    variant: str
    target: str
    path: str
    manifest_sha256: str | None = None
    checked: bool
    unchecked_reason: str | None = None


class PackageFailure(ResultRow):
    variant: str
    target: str
    reason: str


class CheckDataRecord(ResultRow):
    file: str
    sha256: str


class Packages(ResultRow):
    """The deployable packages the run wrote (``report.packages``), those it could not, and their check data."""

    OPTIONAL: ClassVar[frozenset[str]] = frozenset({"chosen_by", "check_samples", "check_source", "check_data"})

    enabled: bool
    chosen_by: str | None = None
    written: list[PackageWritten] = Field(default_factory=list)
    failed: list[PackageFailure] = Field(default_factory=list)
    check_samples: int | None = None
    check_source: str | None = None
    check_data: CheckDataRecord | None = None
