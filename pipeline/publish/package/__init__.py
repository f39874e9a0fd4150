"""Deployable packages: one folder per (artifact, target) that production code loads without qdeploy.

A package (``<target as runtime-device>-<variant>/``)::

    model.xml + model.bin    openvino:*  openvino.save_model(read_model(onnx)); fp16 weights only for fp16 variants
    model.onnx (+ data)      ort:*       the validated ONNX file byte for byte [+ model.extended.onnx, opt-in]
    runtime.json             how validation loaded it: OpenVINO device and compile properties read back (with
                             INFERENCE_PRECISION_HINT pinned to the precision validated, and ``precision_pinned``
                             saying why when the device default missed), or ORT providers and options
    check/inputs.npz         a few validation samples, and check/reference.npz the run's reference outputs on them
    check.py                 stdlib + numpy + the runtime: sha256 of every file, load, compare within tolerance
    manifest.json            sha256 and size of every file, inputs/outputs, versions, validation metrics, latency,
                             a load-and-run snippet

A package is built in a staging folder beside its final place, checked there with check.py's own code (an
artifact that does not load or drifts from the reference is never published), and renamed into place.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from qdeploy.core import detections
from qdeploy.core.errors import QdeployError
from qdeploy.core.report import Report, as_report
from qdeploy.core.rows import BenchmarkRow, ValidationRow
from qdeploy.core.runtimes import artifact_of, is_pinned_f32
from qdeploy.pipeline.publish.package import check as package_check
from qdeploy.pipeline.publish.package.data import CheckData, save_samples
from qdeploy.pipeline.publish.package.provenance import FROM_REPORT, arbitrated_limits, recorded_tolerances
from qdeploy.pipeline.publish.package.records import (
    PackageCheck,
    PackageLatency,
    PackageManifest,
    PackageModel,
    PackageRun,
    PackageRuntime,
    PackageTensor,
)
from qdeploy.pipeline.publish.store import sha256_file
from qdeploy.pipeline.results.identity import model_signature
from qdeploy.targets import get_target
from qdeploy.targets.openvino import DYNAMIC_QUANTIZATION
from qdeploy.targets.openvino_read import read_onnx

__all__ = ["FORMAT_VERSION", "OPTIMIZED_FILE", "PACKAGE_RUNTIMES", "SNIPPETS", "PackageError", "PackageSource",
           "build_package", "manifest_body", "packable", "package_name", "runtime_settings", "snippet",
           "source_from_report", "write_manifest", "write_openvino", "write_ort"]

log = logging.getLogger(__name__)

FORMAT_VERSION = 1
PACKAGE_RUNTIMES = {"openvino": "openvino", "ort": "onnxruntime"}
"""Target runtimes a package can be made for (reference:cpu is a fidelity check, not a deployment)."""
OPTIMIZED_FILE = "model.extended.onnx"


class PackageError(QdeployError):
    """A package that cannot be made (exit 1) or was asked for wrongly (exit 2, ``input_error``)."""

    def __init__(self, message: str, *, input_error: bool = False) -> None:
        super().__init__(message)
        self.exit_code = 2 if input_error else 1


@dataclass
class PackageSource:
    """One artifact on one target, as the run validated and benchmarked it."""

    variant: str
    target: str
    model_path: Path
    """The artifact's ONNX file (external data files beside it)."""
    validation: ValidationRow
    benchmark: BenchmarkRow | None
    report: Report
    external_data: list[str] = field(default_factory=list)
    tolerances: dict[str, dict[str, float]] | None = None
    """Output -> limits, computed from the run's recipe (``provenance.recipe_tolerances``); None: the row's."""
    tolerances_from: str | None = None
    run: PackageRun | None = None
    """The run this package comes from: its folder and the sha256 of its report.json (``made_by.run``)."""


def package_name(target: str, variant: str) -> str:
    return f"{target.replace(':', '-')}-{variant}"


def packable(target: str) -> bool:
    return target.split(":", 1)[0] in PACKAGE_RUNTIMES


def source_from_report(report: Report | Mapping[str, Any], variant: str, target: str,
                       model_path: Path) -> PackageSource:
    """The artifact's rows of the report; a PackageError (exit 2) when it did not pass validation there."""
    report = as_report(report)
    if not packable(target):
        raise PackageError(f"target {target}: packages are made for ort:* and openvino:* targets", input_error=True)
    validation = next((row for row in report.validation if row.variant == variant and row.target == target), None)
    if validation is None:
        raise PackageError(f"the run did not validate variant '{variant}' on {target}", input_error=True)
    if validation.status != "passed":
        raise PackageError(f"variant '{variant}' on {target} did not pass validation ({validation.status}: "
                           f"{validation.reason or 'no reason recorded'}); it is never packaged",
                           input_error=True)
    if not model_path.is_file():
        raise PackageError(f"variant '{variant}' has no published artifact ({model_path} is missing)", input_error=True)
    artifact = report.artifact(artifact_of(variant))
    bench = next((row for row in report.benchmarks
                  if row.variant == variant and row.target == target and row.status == "ok"), None)
    return PackageSource(variant, target, model_path, validation, bench, report,
                         [entry.file for entry in artifact.external_data] if artifact else [])


def build_package(source: PackageSource, out_dir: Path, check: CheckData, *, ort_optimized: bool = False) -> Path:
    """Write, check and publish one package as out_dir/<runtime-device>-<variant>; returns its folder.

    Raises PackageError when the package fails its own check (nothing is left behind then).
    """
    final = out_dir / package_name(source.target, source.variant)
    out_dir.mkdir(parents=True, exist_ok=True)
    remove_abandoned_staging(out_dir)
    staging = Path(tempfile.mkdtemp(prefix=f".{final.name}{STAGING_MARK}{os.getpid()}-", dir=out_dir))
    os.chmod(staging, 0o777 & ~_umask())  # mkdtemp makes 0700; a package is meant to be shared
    try:
        _write_contents(source, staging, check, ort_optimized)
        _check_staged(source, staging)
        _replace_folder(staging, final)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    log.info("package %s written", final)
    return final


STAGING_MARK = ".tmp-"
"""A package is written in ``.<name>.tmp-<pid>-<random>`` beside its final folder, then renamed."""


def remove_abandoned_staging(out_dir: Path) -> list[Path]:
    """Staging folders a killed ``qdeploy package`` left behind (its process is gone); a live one's is kept."""
    removed = []
    for entry in out_dir.iterdir():
        if not (entry.name.startswith(".") and STAGING_MARK in entry.name and entry.is_dir()
                and not entry.is_symlink()):
            continue
        owner = entry.name.rsplit(STAGING_MARK, 1)[1].split("-", 1)[0]
        if owner.isdigit() and _alive(int(owner)):
            continue
        shutil.rmtree(entry, ignore_errors=True)
        removed.append(entry)
        log.info("removed %s, left by a package run that did not finish", entry)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # exists, owned by someone else
        return True
    return True


def _write_contents(source: PackageSource, folder: Path, check: CheckData, ort_optimized: bool) -> None:
    runtime = PACKAGE_RUNTIMES[source.target.split(":", 1)[0]]
    if runtime == "openvino":
        model = write_openvino(source.model_path, folder, compress_to_fp16=False)
    else:
        model = write_ort(source.model_path, source.external_data, folder, optimized=ort_optimized)
    settings = runtime_settings(source)
    (folder / "runtime.json").write_text(json.dumps(settings, indent=1) + "\n")
    check_record = _write_check(folder, check, source)
    shutil.copyfile(package_check.__file__, folder / "check.py")
    if any(package_check.is_detection_spec(limits) for limits in check_record["tolerances"].values()):
        shutil.copyfile(detections.__file__, folder / package_check.DETECTIONS_MODULE)  # check.py's matcher
    write_manifest(folder, manifest_body(source, model, settings, check_record))


def write_openvino(onnx_path: Path, folder: Path, *, compress_to_fp16: bool) -> PackageModel:
    """IR via save_model.  compress_to_fp16 defaults to True in OpenVINO, which turns float32 weights into fp16:
    an fp32 artifact's (the demo's logits then differ by 0.02, SNR 51.6 dB < fp32's 60), and an fp16 artifact's
    that its stage kept float32 on purpose (overflow, or every node: unidic-lite's fp16 IR flipped an ArgMax label
    its validation had not).  Packages pass False: the IR holds the weights the artifact validated with (float16
    ones stay float16)."""
    import openvino

    model, rewritten = read_onnx(openvino.Core(), onnx_path)  # read as validation read it (rewrites its frontend needs)
    openvino.save_model(model, str(folder / "model.xml"), compress_to_fp16=compress_to_fp16)
    return {"file": "model.xml", "weights": "model.bin", "format": "OpenVINO IR", "compress_to_fp16": compress_to_fp16,
            "converted_with": f"openvino {openvino.get_version()}: save_model(read_model(onnx))",
            **({"rewritten": rewritten} if rewritten else {})}


def write_ort(onnx_path: Path, external: list[str], folder: Path, *, optimized: bool) -> PackageModel:
    """The validated ONNX file byte for byte (external data beside it), and on request an EXTENDED-level
    optimized copy.  Never ALL: ORT_ENABLE_ALL adds NCHWc layouts whose block size depends on the CPU (ORT warns
    the file is not portable); the EXTENDED file is loaded again at ALL so layout transforms run on the server."""
    shutil.copyfile(onnx_path, folder / "model.onnx")
    for name in external:
        shutil.copyfile(onnx_path.parent / name, folder / name)
    record: PackageModel = {"file": "model.onnx", "format": "ONNX", "external_data": list(external)}
    if optimized:
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
        options.optimized_model_filepath = str(folder / OPTIMIZED_FILE)
        ort.InferenceSession(str(folder / "model.onnx"), options, providers=["CPUExecutionProvider"])
        record["optimized"] = {"file": OPTIMIZED_FILE, "level": "ORT_ENABLE_EXTENDED",
                               "load_with": "ORT_ENABLE_ALL (layout transforms then run on the serving CPU)",
                               "onnxruntime": ort.__version__}
    return record


def runtime_settings(source: PackageSource) -> PackageRuntime:
    """How to load the package: what validation ran, read back, never a runtime default that could differ on
    another CPU (OpenVINO would pick bf16 on CPUs that have it unless told the precision that was validated)."""
    runtime, device = source.target.split(":", 1)
    execution = source.validation.execution or {}
    bench_settings = source.benchmark.settings if source.benchmark else None
    threads = source.benchmark.threads if source.benchmark else None
    if runtime == "openvino":
        hint = (bench_settings or {}).get("PERFORMANCE_HINT", "LATENCY")
        properties: dict[str, str | int] = {"PERFORMANCE_HINT": hint}
        pinned = source.validation.deploy_precision
        if pinned or execution.get("precision"):
            properties["INFERENCE_PRECISION_HINT"] = pinned or execution["precision"]
        grouping = (bench_settings or {}).get(DYNAMIC_QUANTIZATION)  # int8 activations or not, as it ran
        if grouping is None and properties.get("INFERENCE_PRECISION_HINT") == "f32":
            grouping = 0  # the adapter's pinned f32: float32 activations before compressed weights too
        if isinstance(grouping, int):
            properties[DYNAMIC_QUANTIZATION] = grouping
        if isinstance(threads, int):
            properties["INFERENCE_NUM_THREADS"] = threads
        return {"runtime": "openvino", "device": device.upper(), "properties": properties,
                "validated_with": execution.get("precision"), "benchmarked_with": bench_settings,
                **_pinned_record(source.validation)}

    adapter = get_target(source.target)
    # the adapter's own rule, with validation's pinning (float32 artifacts pinned to float32 math)
    provider_options, _ = adapter._provider_options(source.validation.precision == "fp32")
    return {"runtime": "onnxruntime", "providers": adapter.providers, "provider_options": provider_options,
            "session_options": {"graph_optimization_level": "ORT_ENABLE_ALL",
                                "intra_op_num_threads": threads if isinstance(threads, int) else 0,
                                "execution_mode": "ORT_SEQUENTIAL"},
            "validated_with": execution.get("providers"), "benchmarked_with": bench_settings}


def _pinned_record(validation: ValidationRow) -> PackageRuntime:
    """Why runtime.json pins a precision the device would not pick: its default missed the tolerance, or the row
    is a weight-only artifact's ``@f32`` row (the verdict found it faster than the default)."""
    if not validation.deploy_precision:
        return {}
    if is_pinned_f32(validation.variant):
        return {"precision_pinned": {
            "INFERENCE_PRECISION_HINT": validation.deploy_precision,
            "why": f"the weight-only artifact with its activations in float32, validated and timed pinned to "
                   f"{validation.deploy_precision} as its own row ({validation.variant}) beside the device default",
            "attempts": validation.precision_attempts}}
    default = (validation.precision_attempts or [{}])[0]
    return {"precision_pinned": {
        "INFERENCE_PRECISION_HINT": validation.deploy_precision,
        "why": f"the device default ({default.get('ran')}) missed the validation tolerance "
               f"({default.get('reason') or 'failed'}); {validation.deploy_precision} pinned holds",
        "attempts": validation.precision_attempts}}


def _write_check(folder: Path, check: CheckData, source: PackageSource) -> PackageCheck:
    tolerances = recorded_tolerances(source.validation) if source.tolerances is None else source.tolerances
    tolerances, lowered = arbitrated_limits(tolerances, source.validation)
    origin = source.tolerances_from or FROM_REPORT
    record: PackageCheck = {"samples": check.samples, "compares_with": check.source, "tolerances": tolerances,
                            "tolerances_from": f"{origin}; {lowered}" if lowered else origin,
                            "note": _check_note(check.samples, source.validation.samples)}
    if not check.samples:
        return {**record, "samples": 0, "left_out": check.left_out or "no check data"}
    (folder / "check").mkdir()
    save_samples(folder / "check" / "inputs.npz", check.feeds)
    save_samples(folder / "check" / "reference.npz", check.reference)
    return {**record, "inputs": "check/inputs.npz", "reference": "check/reference.npz"}


def _check_note(samples: int, validated: int | None) -> str:
    if validated is None or samples >= validated:
        return "the limits validation held this artifact to, on the samples validation compared"
    return (f"the limits validation held this artifact to, on the first {samples} of the {validated} samples "
            "validation compared (those fit the check data's size cap); a subset's metrics can fall below the "
            "whole set's")


def manifest_body(source: PackageSource, model: PackageModel, settings: PackageRuntime,
                  check: PackageCheck) -> PackageManifest:
    report, validation, bench = source.report, source.validation, source.benchmark
    environment = report.environment
    versions = environment.versions if environment else {}
    signature = model_signature(source.model_path)
    return {
        "format_version": FORMAT_VERSION, "target": source.target, "variant": source.variant,
        "precision": validation.precision, "runtime": settings["runtime"],
        "runtime_version": versions.get(settings["runtime"]), "qdeploy_version": versions.get("qdeploy"),
        "made_by": {"recipe": report.recipe.name, "run_created": report.created,
                    "run": source.run,
                    "artifact": {"file": f"artifacts/{source.model_path.name}",  # fp32@default: fp32.onnx
                                 "sha256": sha256_file(source.model_path)},
                    "cpu": environment.cpu.model if environment else None,
                    "int8_path": environment.int8_path.kind if environment and environment.int8_path else None,
                    "versions": versions},
        "model": model, "inputs": signature["inputs"], "outputs": signature["outputs"], "load": settings,
        "validation": {"status": validation.status, "metrics": validation.metrics.to_json(),
                       "tolerance": validation.tolerance, "samples": validation.samples,
                       "effective_precision": validation.effective_precision, "warnings": validation.warnings,
                       **({"deploy_precision": validation.deploy_precision} if validation.deploy_precision else {})},
        "latency": None if bench is None else _latency_record(bench),
        "check": check, "snippet": snippet(settings["runtime"], signature["inputs"], signature["outputs"]),
        "portability": "int8 results depend on the CPU's int8 path (made_by.int8_path); run check.py on the "
                       "serving machine before trusting these numbers there",
    }


def _latency_record(bench: BenchmarkRow) -> PackageLatency:
    return {"latency_ms": bench.latency_ms.to_json() if bench.latency_ms else None,
            "throughput_per_s": bench.throughput_per_s, "batch_size": bench.batch_size, "noisy": bench.noisy,
            "mode": bench.mode, "speedup": bench.speedup, "speedup_range": bench.speedup_range,
            "threads": bench.threads}


def write_manifest(folder: Path, body: PackageManifest) -> None:
    """The manifest with the sha256 and size of every other file of the folder."""
    files = {path.relative_to(folder).as_posix(): {"sha256": package_check.sha256_file(path),
                                                   "size_bytes": path.stat().st_size}
             for path in sorted(folder.rglob("*")) if path.is_file() and path.name != package_check.MANIFEST}
    (folder / package_check.MANIFEST).write_text(json.dumps({**body, "files": files}, indent=1) + "\n")


SNIPPETS = {
    "openvino": """import json, numpy as np, openvino as ov
runtime = json.load(open("runtime.json"))
compiled = ov.Core().compile_model("model.xml", runtime["device"], runtime["properties"])
results = compiled({INPUTS})
outputs = {name: results[compiled.output(name)] for name in {OUTPUTS}}  # by ONNX name, not get_any_name()
""",
    "onnxruntime": """import json, numpy as np, onnxruntime as ort
runtime = json.load(open("runtime.json"))
options = ort.SessionOptions()
settings = runtime["session_options"]
options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, settings["graph_optimization_level"])
options.intra_op_num_threads = settings["intra_op_num_threads"]  # 0: one per physical core
session = ort.InferenceSession("model.onnx", options, providers=runtime["providers"],
                               provider_options=runtime["provider_options"])
outputs = dict(zip({OUTPUTS}, session.run({OUTPUTS}, {INPUTS})))
""",
}


def snippet(runtime: str, inputs: list[PackageTensor], outputs: list[PackageTensor]) -> str:
    """Load-and-run code for the package's runtime, fed with zeros of the declared shapes (1 for free dims)."""
    feeds = ", ".join(f'"{spec["name"]}": np.zeros({[d if isinstance(d, int) else 1 for d in spec["shape"] or []]}, '
                      f'np.{package_check.NUMPY_TYPES.get(spec["type"]) or spec["type"]})' for spec in inputs)
    names = repr([spec["name"] for spec in outputs])
    return SNIPPETS[runtime].replace("{INPUTS}", "{" + feeds + "}").replace("{OUTPUTS}", names)


def _check_staged(source: PackageSource, folder: Path) -> None:
    """check.py's checks on the staged package; an optional optimized model that fails is dropped, a main model
    that fails stops the package."""
    lines: list[str] = []
    found = package_check.check_package(folder, say=lines.append)
    log.debug("package %s-%s check:\n%s", source.target, source.variant, "\n".join(lines))
    main_problems = [f"{where}: {problem}" for where, items in found.items() if where != OPTIMIZED_FILE
                     for problem in items]
    if main_problems:
        raise PackageError(f"package of '{source.variant}' on {source.target} failed its check: "
                           f"{'; '.join(main_problems)}")
    if found.get(OPTIMIZED_FILE):
        log.warning("package %s-%s: the optimized model is left out: %s", source.target, source.variant,
                    "; ".join(found[OPTIMIZED_FILE]))
        manifest = json.loads((folder / package_check.MANIFEST).read_text())
        (folder / OPTIMIZED_FILE).unlink()
        manifest["model"]["optimized_left_out"] = "; ".join(found[OPTIMIZED_FILE])
        del manifest["model"]["optimized"], manifest["files"]
        write_manifest(folder, manifest)


def _replace_folder(staging: Path, final: Path) -> None:
    """Rename the staged package into place; an older package there is moved aside first and removed after."""
    aside = None
    if final.exists():
        aside = final.with_name(f".{final.name}.old-{os.getpid()}")
        shutil.rmtree(aside, ignore_errors=True)
        os.rename(final, aside)
    os.rename(staging, final)
    if aside is not None:
        shutil.rmtree(aside, ignore_errors=True)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
