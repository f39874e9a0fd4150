"""Check a qdeploy package: its files match manifest.json, the model loads with runtime.json, and its outputs on
check/inputs.npz agree with the run's reference outputs (check/reference.npz) within the tolerance it was
validated against.

This file is copied into every package as ``check.py``.  It needs only the Python standard library, numpy and
the package's runtime (openvino or onnxruntime), never qdeploy: keep it so (a test runs it where qdeploy cannot
be imported).  The metrics follow qdeploy's validation (qdeploy/core/compare.py; a test holds the two together).

    python check.py                      # exit 0: every check passed; 1: a check failed (it says which)
    python check.py --require-no-qdeploy # also fail when qdeploy is importable (proves independence)
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import math
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

import numpy as np

if TYPE_CHECKING:  # a package's check.py runs without qdeploy: the records are names for type checkers only
    from qdeploy.pipeline.publish.package.records import PackageManifest, PackageRuntime, PackageTensor

__all__ = ["DETECTIONS_MODULE", "MANIFEST", "NUMPY_TYPES", "QDEPLOY_MODULES", "SNR_CAP_DB", "CheckedOutput",
           "Runner", "cast_feed", "check_outputs", "check_package", "detection_problems", "is_detection_spec",
           "load_samples", "main", "model_files", "openvino_runner", "ort_runner", "output_metrics", "precision_word",
           "say", "sha256_file", "verify_files"]

QDEPLOY_MODULES = ("qdeploy", "pipeline", "stages", "calibration")
DETECTIONS_MODULE = "detections.py"
"""qdeploy/core/detections.py, copied beside check.py into a package whose validation matched boxes."""
SNR_CAP_DB = 200.0
MANIFEST = "manifest.json"
Runner = Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]


class CheckedOutput(TypedDict, total=False):
    """One output's metrics over the check samples (``top1_agreement`` where its limits ask for it)."""

    max_abs_err: float
    cosine: float
    snr_db: float
    nonfinite: int
    top1_agreement: float


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def outside(folder: Path, name: str) -> str | None:
    """Why a file name of the manifest does not stay inside the package folder (absolute, '..', a symbolic link
    on the way out); None when it does.  A manifest is data: it never makes the check read or run another file."""
    parts = Path(name).parts
    if not name or Path(name).is_absolute() or ".." in parts:
        return f"{name!r}: not a path inside the package folder"
    path, root = folder / name, folder.resolve()
    for depth in range(1, len(parts) + 1):
        if (folder / Path(*parts[:depth])).is_symlink():
            return f"{name}: a symbolic link, which a package never holds"
    if root != path.resolve() and root not in path.resolve().parents:
        return f"{name}: leads outside the package folder"
    return None


def verify_files(folder: Path, manifest: PackageManifest) -> list[str]:
    """One problem per file that is missing or whose sha256 or size differs from the manifest; files that are
    in the folder but not in the manifest are problems too (a package is exactly what its manifest lists).
    Every name the manifest uses (files, model, check data) must stay inside the folder."""
    listed = manifest.get("files") or {}
    named = list(dict.fromkeys([*listed, *_named_by(manifest)]))
    problems = [problem for problem in map(lambda name: outside(folder, name), named) if problem]
    if problems:
        return problems  # nothing outside the folder is read, hashed or run
    problems += [f"{name}: named by the manifest but not among its files" for name in _named_by(manifest)
                 if name not in listed]
    for name, record in sorted(listed.items()):
        path = folder / name
        if not path.is_file():
            problems.append(f"{name}: missing")
        elif path.stat().st_size != record.get("size_bytes"):
            problems.append(f"{name}: {path.stat().st_size} bytes, the manifest says {record.get('size_bytes')}")
        elif sha256_file(path) != record.get("sha256"):
            problems.append(f"{name}: sha256 {sha256_file(path)} differs from the manifest's {record.get('sha256')}")
    extra = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*")
                   if p.is_file() and p.name != MANIFEST and "__pycache__" not in p.parts)
    problems += [f"{name}: not in the manifest" for name in extra if name not in listed]
    return problems


def _named_by(manifest: PackageManifest) -> list[str]:
    """The files the check opens: the model files and the check data."""
    check = manifest.get("check") or {}
    return [*model_files(manifest), *(check[key] for key in ("inputs", "reference") if check.get(key))]


def load_samples(path: Path) -> list[dict[str, np.ndarray]]:
    """Samples stored as '<index>/<name>' arrays, in index order."""
    samples: dict[int, dict[str, np.ndarray]] = {}
    with np.load(path, allow_pickle=False) as data:
        for key in data.files:
            index, name = key.split("/", 1)
            samples.setdefault(int(index), {})[name] = data[key]
    return [samples[index] for index in sorted(samples)]


NUMPY_TYPES = {"float": "float32", "double": "float64", "bfloat16": None, "string": None}


def cast_feed(feed: dict[str, np.ndarray], inputs: list[PackageTensor]) -> dict[str, np.ndarray]:
    """A sample in the element types the package's model declares (an fp16 model may take float16)."""
    types = {spec["name"]: NUMPY_TYPES.get(spec["type"], spec["type"]) for spec in inputs}
    return {name: value.astype(types[name]) if types.get(name) else value for name, value in feed.items()}


PRECISION_WORDS = {"bfloat16": "bf16", "float16": "f16", "float32": "f32", "float64": "f64"}


def precision_word(hint: Any) -> str:
    """OpenVINO's inference precision as the word runtime.json uses ('bf16', 'f32'): its Type prints as
    "<Type: 'bfloat16'>", and get_type_name is missing in some versions."""
    method = getattr(hint, "get_type_name", None) or getattr(hint, "to_string", None)
    word = str(method() if callable(method) else hint).strip().strip("<>").removeprefix("Type:").strip(" '\"")
    return PRECISION_WORDS.get(word.lower(), word)


def openvino_runner(folder: Path, runtime: PackageRuntime, model_file: str,
                    outputs: list[str]) -> tuple[Runner, str]:
    import openvino as ov

    compiled = ov.Core().compile_model(str(folder / model_file), runtime["device"], runtime["properties"])
    # By the ONNX names of the manifest: save_model may give a port a second name, and get_any_name() then
    # returns that one (an fp16 IR's 'logits' port also answers to 'head/gemm_cast_to_logits').
    ports = {name: compiled.output(name) for name in outputs}
    precision = precision_word(compiled.get_property("INFERENCE_PRECISION_HINT"))
    pinned = (runtime.get("properties") or {}).get("INFERENCE_PRECISION_HINT")

    def run(feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        result = compiled(feed)
        return {name: np.array(result[port]) for name, port in ports.items()}

    said = f"openvino {ov.get_version()} on {runtime['device']}, inference precision {precision}"
    if pinned and pinned != precision:  # OpenVINO ignores a hint the device cannot run: say it, the outputs decide
        said += f" (runtime.json pins {pinned}, which this device does not run)"
    elif pinned:
        said += " (pinned by runtime.json)"
    return run, said


def ort_runner(folder: Path, runtime: PackageRuntime, model_file: str, outputs: list[str]) -> tuple[Runner, str]:
    import onnxruntime as ort

    settings = runtime["session_options"]
    options = ort.SessionOptions()
    options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, settings["graph_optimization_level"])
    options.intra_op_num_threads = settings["intra_op_num_threads"]
    session = ort.InferenceSession(str(folder / model_file), options, providers=runtime["providers"],
                                   provider_options=runtime["provider_options"])
    used = session.get_providers()
    if used[0] != runtime["providers"][0]:
        raise RuntimeError(f"onnxruntime fell back to {used} instead of {runtime['providers'][0]}")

    def run(feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {name: numeric(value) for name, value in zip(outputs, session.run(outputs, feed), strict=True)}

    return run, f"onnxruntime {ort.__version__} with {used[0]}"


def numeric(value: Any) -> np.ndarray:
    """An output as qdeploy's validation reads it (``qdeploy.core.compare.as_array``; a test holds the two equal):
    ONNX Runtime hands a sequence of maps (scikit-learn's ZipMap) back as dicts, compared as one column per class
    in sorted class order when every map has the same numeric classes."""
    array = np.asarray(value)
    items = array.reshape(-1).tolist() if array.dtype == object and array.size else []
    if items and all(isinstance(item, str) for item in items):
        return array.astype(str)
    if not items or not all(isinstance(item, dict) for item in items):
        return array
    keys = sorted(items[0])
    if any(sorted(item) != keys for item in items) or not all(
            isinstance(number, int | float | np.number) for item in items for number in item.values()):
        return array
    return np.array([[item[key] for key in keys] for item in items], np.float64).reshape(*array.shape, len(keys))


def output_metrics(reference: list[np.ndarray], candidate: list[np.ndarray], limits: dict[str, Any],
                   name: str = "") -> tuple[CheckedOutput, list[str]]:
    """Metrics of one output over all samples (float64, flattened, as qdeploy's validation) and broken limits; an
    integer output its limits' ``integer_values`` name is held to them as a float output is."""
    if any(r.shape != c.shape for r, c in zip(reference, candidate, strict=True)):
        return {}, [f"shape {[list(c.shape) for c in candidate]} where the reference has "
                    f"{[list(r.shape) for r in reference]}"]
    ref = np.concatenate([r.reshape(-1) for r in reference]).astype(np.float64)
    got = np.concatenate([c.reshape(-1) for c in candidate]).astype(np.float64)
    nonfinite = int(np.count_nonzero(~np.isfinite(got)))
    finite = np.isfinite(ref) & np.isfinite(got)
    ref, got = ref[finite], got[finite]
    err = np.abs(got - ref)
    found: CheckedOutput = {"max_abs_err": float(err.max()) if err.size else 0.0,
                            "cosine": _cosine(ref, got), "snr_db": _snr_db(ref, err), "nonfinite": nonfinite}
    problems = [f"{nonfinite} NaN/Inf values"] if nonfinite else []
    if reference[0].dtype.kind != "f" and name not in (limits.get("integer_values") or ()):
        differing = int(np.count_nonzero(err))
        if "mismatch_max" not in limits and differing:
            problems.append(f"{differing} integer/bool elements differ; they must match exactly")
        elif differing > limits.get("mismatch_max", 0.0) * err.size:
            problems.append(f"{differing} of {err.size} integer/bool elements differ > mismatch_max "
                            f"{limits['mismatch_max']}")
        return found, problems
    problems += _broken_limits(found, limits, ref, err, reference, candidate)
    return found, problems


def _broken_limits(found: CheckedOutput, limits: dict[str, float], ref: np.ndarray, err: np.ndarray,
                   reference: list[np.ndarray], candidate: list[np.ndarray]) -> list[str]:
    problems = []
    if "cosine_min" in limits and found["cosine"] < limits["cosine_min"]:
        problems.append(f"cosine {found['cosine']:.6f} < cosine_min {limits['cosine_min']}")
    if "snr_db_min" in limits and found["snr_db"] < limits["snr_db_min"]:
        problems.append(f"SNR {found['snr_db']:.2f} dB < snr_db_min {limits['snr_db_min']}")
    if "rtol" not in limits and "atol" in limits and found["max_abs_err"] > limits["atol"]:
        problems.append(f"max abs err {found['max_abs_err']:.4g} > atol {limits['atol']}")
    if "rtol" in limits:
        outside = int(np.count_nonzero(err > limits.get("atol", 0.0) + limits["rtol"] * np.abs(ref)))
        if outside:
            problems.append(f"{outside} of {err.size} elements outside atol {limits.get('atol', 0.0)} + "
                            f"rtol {limits['rtol']}*|ref|")
    shape = reference[0].shape
    if "top1_agreement_min" in limits and len(shape) >= 2 and shape[-1] >= 2 and all(d == 1 for d in shape[1:-1]):
        ref_rows = np.concatenate([r.reshape(-1, shape[-1]) for r in reference])
        got_rows = np.concatenate([c.reshape(-1, shape[-1]) for c in candidate])
        found["top1_agreement"] = float(np.mean(ref_rows.argmax(axis=1) == got_rows.argmax(axis=1)))
        if found["top1_agreement"] < limits["top1_agreement_min"]:
            problems.append(f"top-1 agreement {found['top1_agreement']:.4g} < {limits['top1_agreement_min']}")
    return problems


def _cosine(ref: np.ndarray, got: np.ndarray) -> float:
    ref_norm, got_norm = float(np.linalg.norm(ref)), float(np.linalg.norm(got))
    if ref_norm == 0.0 or got_norm == 0.0:
        return 1.0 if ref_norm == got_norm else 0.0
    return float(np.clip(np.dot(ref, got) / (ref_norm * got_norm), -1.0, 1.0))


def _snr_db(ref: np.ndarray, err: np.ndarray) -> float:
    signal, noise = float(np.sum(ref * ref)), float(np.sum(err * err))
    if noise == 0.0:
        return SNR_CAP_DB
    if signal == 0.0:
        return -SNR_CAP_DB
    return float(np.clip(10.0 * math.log10(signal / noise), -SNR_CAP_DB, SNR_CAP_DB))


def is_detection_spec(limits: dict[str, Any]) -> bool:
    """Whether an output's limits are validate.detections (boxes matched by IoU) rather than output limits."""
    return "boxes" in limits


def detection_problems(folder: Path, spec: dict[str, Any], references: list[dict[str, np.ndarray]],
                       results: list[dict[str, np.ndarray]], say: Callable[[str], None]) -> list[str]:
    """The detector's boxes matched by IoU as validation matched them, with the package's copy of its matcher."""
    loader = importlib.util.spec_from_file_location("qdeploy_package_detections", folder / DETECTIONS_MODULE)
    if loader is None or loader.loader is None or not (folder / DETECTIONS_MODULE).is_file():
        return [f"{DETECTIONS_MODULE} is missing: the detections cannot be matched"]
    module = importlib.util.module_from_spec(loader)
    writes, sys.dont_write_bytecode = sys.dont_write_bytecode, True  # no __pycache__ in the package folder
    try:
        loader.loader.exec_module(module)
    finally:
        sys.dont_write_bytecode = writes
    found, broken = module.match_detections(spec, references, results)
    if found:
        say(f"  detections {spec['boxes']}: {found['matched']} matched of {found['reference_detections']} "
            f"(recall {found['recall']:.3f}, precision {found['precision']:.3f}) over {len(results)} samples")
    return [f"detections {spec['boxes']}: {problem}" for problem in broken]


def check_outputs(folder: Path, run: Runner, manifest: PackageManifest, say: Callable[[str], None]) -> list[str]:
    """Run the check samples and hold every output to its validated limits."""
    check = manifest["check"]
    feeds = load_samples(folder / check["inputs"])
    references = load_samples(folder / check["reference"])
    results = [run(cast_feed(feed, manifest["inputs"])) for feed in feeds]
    tolerances = check.get("tolerances") or {}
    empty = [name for name, limits in tolerances.items() if not limits]
    if not tolerances or empty:  # a check that compares nothing has not passed
        return [f"no tolerance to hold {'the outputs' if not tolerances else ', '.join(empty)} to: the manifest "
                "names none, so nothing would be compared"]
    problems = []
    for name, limits in tolerances.items():
        if is_detection_spec(limits):
            problems += detection_problems(folder, limits, references, results, say)
            continue
        found, broken = output_metrics([r[name] for r in references], [r[name] for r in results], limits, name)
        if found:
            say(f"  output {name}: cosine {found['cosine']:.6f}, SNR {found['snr_db']:.1f} dB, max abs err "
                f"{found['max_abs_err']:.3g} over {len(feeds)} samples")
        problems += [f"output {name}: {problem}" for problem in broken]
    return problems


def model_files(manifest: PackageManifest) -> list[str]:
    model = manifest.get("model") or {}
    return [*([model["file"]] if model.get("file") else []),
            *([model["optimized"]["file"]] if model.get("optimized") else [])]


def check_package(folder: Path, say: Callable[[str], None] = print) -> dict[str, list[str]]:
    """Problems by what they concern: 'files', and each model file of the package (empty lists: passed)."""
    manifest = json.loads((folder / MANIFEST).read_text())
    found: dict[str, list[str]] = {"files": verify_files(folder, manifest)}
    say(f"files: {len(manifest['files'])} checked against the manifest's sha256"
        + (f"; {len(found['files'])} problems" if found["files"] else ", all match"))
    if found["files"]:
        return found  # a changed file is reason enough; do not load what is not what was validated
    runtime = json.loads((folder / "runtime.json").read_text())
    outputs = [spec["name"] for spec in manifest["outputs"]]
    make = openvino_runner if runtime["runtime"] == "openvino" else ort_runner
    for model_file in model_files(manifest):
        try:
            run, what = make(folder, runtime, model_file, outputs)
        except Exception as exc:
            found[model_file] = [f"cannot load: {type(exc).__name__}: {' '.join(str(exc).split())[:400]}"]
            continue
        say(f"{model_file} on {what}:")
        if not manifest["check"].get("samples"):
            say(f"  outputs unchecked: {manifest['check'].get('left_out', 'no check data in this package')}")
            found[model_file] = []
            continue
        found[model_file] = check_outputs(folder, run, manifest, say)
    return found


def say(line: str) -> None:
    """Print one line; a reader that stops reading (``python check.py | head -1``) does not stop the check, whose
    exit status still says whether the package passed: the rest of the output goes to /dev/null."""
    try:
        print(line, flush=True)
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--require-no-qdeploy", action="store_true",
                        help="Fail when qdeploy (or its modules) can be imported here: proves independence.")
    args = parser.parse_args()
    if args.require_no_qdeploy:
        importable = [name for name in QDEPLOY_MODULES if importlib.util.find_spec(name) is not None]
        if importable:
            say(f"FAIL: this interpreter can import {importable}; the check needs an environment without qdeploy")
            return 1
        say(f"qdeploy importable: no ({', '.join(QDEPLOY_MODULES)} not found)")
    found = check_package(Path(__file__).resolve().parent, say)
    problems = [f"{where}: {problem}" for where, items in found.items() for problem in items]
    for problem in problems:
        say(f"FAIL: {problem}")
    say("PASS" if not problems else "FAILED")
    return 0 if not problems else 1


if __name__ == "__main__":
    sys.exit(main())
