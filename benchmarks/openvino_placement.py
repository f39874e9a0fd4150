"""qdeploy's OpenVINO placement (``runtime: openvino``) before and after ``stages/quantize/ptq/_openvino.py``,
beside NNCF.

    python benchmarks/openvino_placement.py [--models yolox-captcha pp-ocr-det pp-ocr-rec] [--rounds 9]
                                            [--without STEP ...]

For each real-model corpus CNN (``tests/real_recipes``; ``python -m tests.real_models`` fetches them): calibrate
once on 16 calibration images, build ``runtime: openvino`` with today's placement (``new``) and with its
OpenVINO-only steps switched off (``old``: ORT's Concat ranges, every Q/DQ pair kept, the tail and attention
quantized, a MaxPool or a Transpose after a Relu quantized after itself, every signed activation uint8), today's
placement with only ranges centred on zero on int8 (``new``: what ``signed_activations: auto`` keeps where int8
costs lopsided ranges accuracy) and with every signed activation on int8 with zero point 0 (``new+signed``: what
auto keeps otherwise, and ``signed_activations: symmetric``), and NNCF's ``nncf.quantize`` (defaults, same
images).  Cosine: the worst over 8 validation images, OpenVINO f32.  Latency: OpenVINO at its default inference
precision, 1 thread, CPU time per call (robust to other jobs on the machine), median over rounds that interleave
the models.  Weights are 7-bit (``reduce_range``
auto) in both of qdeploy's builds.  ``--without STEP``: also today's placement with that one OpenVINO-only step
switched off (``new-STEP``), to weigh one step alone.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.int8_peers import nncf_artifacts  # noqa: E402
from qdeploy.calibration import DatasetSpec, data_context  # noqa: E402
from qdeploy.stages.quantize.ptq import _ptq  # noqa: E402
from qdeploy.stages.quantize.ptq._prepare import prepare  # noqa: E402
from tests.real_recipes import Sizes, write_recipe  # noqa: E402

_OPENVINO_STEPS = ("unify_concat_ranges", "float_tail", "activation_matmuls", "drop_exact_requantization",
                   "pooled_before_quantizing", "moved_before_quantizing")
_OFF: dict[str, Callable[..., Any]] = {
    "unify_concat_ranges": lambda model, ranges, op_types, skip=(): ranges,
    "float_tail": lambda model, op_types, excluded=(): [],
    "activation_matmuls": lambda model: [], "drop_exact_requantization": lambda model: 0,
    "pooled_before_quantizing": lambda model, op_types, excluded: set(),
    "moved_before_quantizing": lambda model, op_types, excluded: set()}


def build(prepared: Path, ranges: dict, path: Path, *, old: bool, signed: bool = False) -> Path:
    """``runtime: openvino`` ptq from fixed ranges; ``old``: with the OpenVINO-only steps switched off; ``signed``:
    every activation that can be negative on int8 with zero point 0 (else only those centred on zero)."""
    return build_replacing(prepared, ranges, path, _OFF if old else {},
                           signed_int8=0.0 if old else _ptq.EVERY_SIGNED if signed else _ptq.CENTRED)


def build_replacing(prepared: Path, ranges: dict, path: Path, replaced: dict[str, Callable[..., Any]], *,
                    signed_int8: float, excluded: tuple[str, ...] = ()) -> Path:
    """``runtime: openvino`` ptq from fixed ranges (7-bit weights), with the ``_ptq`` placement steps named in
    ``replaced`` swapped for the functions given there while it builds, and the ``excluded`` nodes kept float."""
    import onnx

    saved = {name: getattr(_ptq, name) for name in replaced}
    for name, step in replaced.items():
        setattr(_ptq, name, step)
    try:
        builder = _ptq.StaticBuilder(prepared, ranges, list(excluded), per_channel=True, activation_type="uint8",
                                     weight_type="int8", symmetric_activations=False, symmetric_weights=True,
                                     op_types=list(_ptq.BALANCED_OP_TYPES), seven_bit="weights", runtime="openvino",
                                     signed_int8=signed_int8)
        onnx.save(builder([]), str(path))
    finally:
        for name, step in saved.items():
            setattr(_ptq, name, step)
    return path


def _compiled(path: Path, f32: bool) -> Any:
    import openvino as ov

    config = {"INFERENCE_NUM_THREADS": "1", "PERFORMANCE_HINT": "LATENCY"}
    if f32:
        config["INFERENCE_PRECISION_HINT"] = "f32"
    return ov.Core().compile_model(str(path), "CPU", config).create_infer_request()


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.ravel().astype(np.float64), b.ravel().astype(np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b) + 1e-30))


def measure(models: dict[str, Path], val: list[dict], rounds: int,
            iterations: int = 4) -> dict[str, tuple[float, float]]:
    """name -> (worst cosine against fp32 on OpenVINO f32, median CPU ms per call at the default precision)."""
    outputs = {}
    for name, path in models.items():
        request = _compiled(path, f32=True)
        outputs[name] = [request.infer(feed)[0].copy() for feed in val]
    requests = {name: _compiled(path, f32=False) for name, path in models.items()}
    times: dict[str, list[float]] = {name: [] for name in models}
    for request in requests.values():
        request.infer(val[0])
    for _ in range(rounds):
        for name, request in requests.items():
            started = time.process_time()
            for _ in range(iterations):
                request.infer(val[0])
            times[name].append((time.process_time() - started) / iterations * 1e3)
    return {name: (min(_cosine(a, b) for a, b in zip(outputs[name], outputs["fp32"], strict=True)),
                   statistics.median(times[name])) for name in models}


def calibrated(name: str, folder: Path) -> tuple[Path, list[dict], list[dict], Path, dict]:
    """A corpus model's source, 16 calibration and 8 validation samples, prepared model and minmax ranges."""
    recipe = yaml.safe_load(write_recipe(name, folder, Sizes(calib=16, val=8)).read_text())
    source = Path(recipe["model"]["onnx"])
    ctx = data_context("bench", folder, datasets={key: DatasetSpec(**spec) for key, spec in recipe["data"].items()},
                       resolve=lambda path: folder / path)
    calib, val = list(ctx.samples("calib", source, 16)), list(ctx.samples("val", source, 8))
    prepared = prepare(source, folder).path
    ranges, _ = _ptq.calibrate(prepared, list(_ptq.BALANCED_OP_TYPES), lambda: iter(calib), folder, "minmax", 99.999)
    return source, calib, val, prepared, ranges


def run_model(name: str, folder: Path, rounds: int, without: tuple[str, ...] = ()) -> list[str]:
    source, calib, val, prepared, ranges = calibrated(name, folder)
    models = {"fp32": source, "old": build(prepared, ranges, folder / "old.onnx", old=True),
              "new": build(prepared, ranges, folder / "new.onnx", old=False),
              "new+signed": build(prepared, ranges, folder / "signed.onnx", old=False, signed=True)}
    for step in without:
        models[f"new-{step}"] = build_replacing(prepared, ranges, folder / f"without-{step}.onnx",
                                                {step: _OFF[step]}, signed_int8=_ptq.CENTRED)
    built, note = nncf_artifacts(source, calib, folder, transformer=False)
    models.update({label: path for label, path, _ in built})
    results = measure(models, val, rounds)
    base = results.get("nncf", results["old"])[1]
    return [f"| {name} | {label} | {cosine:.4f} | {ms:.2f} | {results['fp32'][1] / ms:.2f}x | {ms / base:.3f} |"
            for label, (cosine, ms) in results.items()] + ([f"| {name} | ({note}) | | | | |"] if note else [])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=["yolox-captcha", "pp-ocr-det", "pp-ocr-rec"])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--without", nargs="*", default=[], choices=_OPENVINO_STEPS)
    args = parser.parse_args()
    lines = ["| model | build | worst cosine (val) | CPU ms | speedup vs fp32 | latency / NNCF's |",
             "|---|---|---|---|---|---|"]
    for name in args.models:
        with tempfile.TemporaryDirectory(prefix=f"qdeploy-ov-placement-{name}-") as tmp:
            lines += run_model(name, Path(tmp), args.rounds, tuple(args.without))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
