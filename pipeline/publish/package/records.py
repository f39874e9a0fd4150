"""The records of a package's manifest.json and runtime.json: their one definition (qdeploy writes them; the
package's check.py reads them and names them for type checkers only, as it runs without qdeploy)."""

from __future__ import annotations

from typing import Any, TypedDict

__all__ = ["PackageArtifactFile", "PackageCheck", "PackageFileRecord", "PackageLatency", "PackageMadeBy",
           "PackageManifest", "PackageModel", "PackageOptimizedModel", "PackagePinned", "PackageRun", "PackageRuntime",
           "PackageSessionOptions", "PackageTensor", "PackageValidation"]


class PackageFileRecord(TypedDict):
    """A file of the package as manifest.json lists it (``files``)."""

    sha256: str
    size_bytes: int


class PackageTensor(TypedDict):
    """A model input or output: name, element type, shape (symbolic dimensions as names)."""

    name: str
    type: str
    shape: list[int | str] | None


class PackageOptimizedModel(TypedDict):
    """``model.optimized``: the opt-in EXTENDED-level ONNX Runtime copy."""

    file: str
    level: str
    load_with: str
    onnxruntime: str


class PackageModel(TypedDict, total=False):
    """manifest.json's ``model``: the model file and how it was made from the validated ONNX file."""

    file: str
    format: str
    weights: str
    compress_to_fp16: bool
    converted_with: str
    rewritten: list[str]
    external_data: list[str]
    optimized: PackageOptimizedModel
    optimized_left_out: str


class PackageSessionOptions(TypedDict):
    """runtime.json's ONNX Runtime ``session_options``."""

    graph_optimization_level: str
    intra_op_num_threads: int
    execution_mode: str


class PackagePinned(TypedDict):
    """runtime.json's ``precision_pinned``: why a precision the device would not pick is pinned."""

    INFERENCE_PRECISION_HINT: str
    why: str
    attempts: list[dict[str, Any]] | None


class PackageRuntime(TypedDict, total=False):
    """runtime.json: how validation loaded the model (OpenVINO device and properties, or ORT providers)."""

    runtime: str
    device: str
    properties: dict[str, str | int]
    providers: list[str]
    provider_options: list[dict[str, str]]
    session_options: PackageSessionOptions
    validated_with: str | list[str] | None
    benchmarked_with: dict[str, Any] | None
    precision_pinned: PackagePinned


class PackageCheck(TypedDict, total=False):
    """manifest.json's ``check``: the samples, the reference outputs and the limits they are held to."""

    samples: int
    compares_with: str
    tolerances: dict[str, dict[str, Any]]
    """Per output, the limits validation held it to; for a detector's boxes, validate.detections itself."""
    tolerances_from: str
    note: str
    left_out: str
    inputs: str
    reference: str


class PackageRun(TypedDict, total=False):
    """``made_by.run``: the run a package comes from, its folder and the sha256 of its report.json."""

    folder: str
    report: str
    report_sha256: str | None
    why: str


class PackageArtifactFile(TypedDict):
    file: str
    sha256: str


class PackageMadeBy(TypedDict):
    recipe: str
    run_created: str
    run: PackageRun | None
    artifact: PackageArtifactFile
    cpu: str | None
    int8_path: str | None
    versions: dict[str, str | None]


class PackageValidation(TypedDict, total=False):
    status: str
    metrics: dict[str, float | None]
    tolerance: dict[str, float] | None
    samples: int | None
    effective_precision: str | None
    warnings: list[str]
    deploy_precision: str


class PackageLatency(TypedDict):
    latency_ms: dict[str, float | list[float] | None] | None
    throughput_per_s: float | None
    batch_size: int
    noisy: bool | None
    mode: str | None
    speedup: float | None
    speedup_range: list[float] | None
    threads: int | None


class PackageManifest(TypedDict, total=False):
    """manifest.json."""

    format_version: int
    target: str
    variant: str
    precision: str | None
    runtime: str
    runtime_version: str | None
    qdeploy_version: str | None
    made_by: PackageMadeBy
    model: PackageModel
    inputs: list[PackageTensor]
    outputs: list[PackageTensor]
    load: PackageRuntime
    validation: PackageValidation
    latency: PackageLatency | None
    check: PackageCheck
    snippet: str
    portability: str
    files: dict[str, PackageFileRecord]
