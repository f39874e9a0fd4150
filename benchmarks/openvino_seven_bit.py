"""Signed activations beside 7-bit ones in OpenVINO's graph: the build for a graph only OpenVINO runs against the
build where ONNX Runtime may run it too, beside NNCF.

    python benchmarks/openvino_seven_bit.py [--models demo resnet18 pp-ocr-det pp-ocr-rec] [--rounds 15]

For each model of ``benchmarks/int8.py`` (its builders, calibration and evaluation samples), the quantize stage
with ``runtime: openvino`` and its defaults, built twice from the same calibration samples:

- ``shared``: variant ``int8`` with an ONNX Runtime target beside OpenVINO's (``ort:cpu``, ``openvino:cpu``): where
  7-bit activations are chosen they all stay uint8 with a zero point, since ONNX Runtime's kernels without VNNI
  would saturate an 8-bit int8 input;
- ``openvino``: variant ``int8@openvino`` (what ``per_runtime`` builds for OpenVINO targets): signed activations go
  on int8 with zero point 0 and 8 bits beside the 7-bit unsigned ones (oneDNN halves the weights for an int8 input
  on CPUs without VNNI rather than saturate: ``stages/quantize/_common.py``);

and NNCF's ``nncf.quantize`` (defaults).  Per build: the 7-bit operand and the signed-activation choice from the
sidecar; the worst cosine and SNR against fp32 over the evaluation samples (``compare_outputs``, as
``benchmarks/int8.py``), both on OpenVINO pinned to f32; and the CPU ms per call at OpenVINO's default precision
(bf16 float parts on AMX), one thread, the median over rounds in which the builds take turns, each round starting
one build later, each model compiled again in a new order every 5 rounds (:func:`cpu_ms`).
"""

from __future__ import annotations

import argparse
import logging
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.int8 import Row, machine_line, nncf_rows, outputs, qdeploy  # noqa: E402
from benchmarks.int8_models import BUILDERS, Case  # noqa: E402
from qdeploy.core.compare import compare_outputs  # noqa: E402
from qdeploy.core.tolerance import Tolerance  # noqa: E402
from qdeploy.stages.quantize import QuantizeConfig  # noqa: E402

_BUILDS = {"shared": ("int8", ("ort:cpu", "openvino:cpu")), "openvino": ("int8@openvino", ("openvino:cpu",))}


def build(case: Case, folder: Path, label: str) -> Row:
    """The quantize stage's OpenVINO graph as ``label`` (a key of ``_BUILDS``) builds it."""
    variant, targets = _BUILDS[label]
    config = QuantizeConfig(calibration={"data": "calib", "samples": len(case.calib)}, runtime="openvino")
    return qdeploy(case, folder, variant, config, targets)


def cpu_ms(models: dict[str, Path], sample: dict[str, np.ndarray], rounds: int, iterations: int = 10,
           per_compile: int = 5) -> dict[str, float]:
    """Median CPU ms per call at OpenVINO's default precision, one thread.  Every ``per_compile`` rounds each model
    is compiled again, in a new order, and each round starts one model later: one compiled instance of a graph ran
    6% slower than another of the same graph throughout a run (its memory placement), which one compile per model
    would have charged to the graph."""
    import openvino as ov

    config = {"INFERENCE_NUM_THREADS": "1", "PERFORMANCE_HINT": "LATENCY"}
    names, times = list(models), {name: [] for name in models}
    order = random.Random(0)
    for block in range(0, rounds, per_compile):
        order.shuffle(names)
        requests = {name: ov.Core().compile_model(str(models[name]), "CPU", config).create_infer_request()
                    for name in names}
        for request in requests.values():
            request.infer(sample)
        for round_ in range(block, min(block + per_compile, rounds)):
            for name in names[round_ % len(names):] + names[:round_ % len(names)]:
                started = time.process_time()
                for _ in range(iterations):
                    requests[name].infer(sample)
                times[name].append((time.process_time() - started) / iterations * 1e3)
        del requests
    return {name: statistics.median(times[name]) for name in models}


def choices(row: Row, shared: Row) -> str:
    """The build's 7-bit operand and signed-activation choice; whether it is byte for byte ``shared``'s graph."""
    seven_bit = row.findings["reduce_range"]["seven_bit"]
    same = " (the same graph as shared)" if row is not shared and row.path.read_bytes() == shared.path.read_bytes() \
        else ""
    return f"7-bit {seven_bit}, signed on int8: {row.findings['signed_activations']['symmetric']}{same}"


def run_model(name: str, folder: Path, rounds: int) -> list[str]:
    case = BUILDERS[name](folder)
    if case is None:
        return [f"| {name} | (not available: python -m tests.real_models) | | | |"]
    rows = {label: build(case, folder, label) for label in _BUILDS}
    models = {"fp32": case.path, **{label: row.path for label, row in rows.items()}}
    models.update({row.artifact: row.path for row in nncf_rows(case, folder) if row.artifact == "nncf"})
    samples = case.evaluation[:8]
    reference = outputs(case.path, samples, "openvino:cpu")  # pinned to f32
    worst = {label: compare_outputs(reference, outputs(path, samples, "openvino:cpu"), Tolerance()).worst()
             for label, path in models.items() if label != "fp32"}
    timed = cpu_ms(models, samples[0], rounds)
    base = timed.get("nncf", float("nan"))
    return [f"| {name} | {label} | {choices(rows[label], rows['shared']) if label in rows else ''} | "
            f"{worst[label]['cosine']:.4f} / {worst[label]['snr_db']:.1f} | {ms:.3f} | {ms / base:.3f} |"
            if label in worst else f"| {name} | {label} | | - | {ms:.3f} | {ms / base:.3f} |"
            for label, ms in timed.items()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=["demo", "resnet18", "pp-ocr-det", "pp-ocr-rec"],
                        choices=list(BUILDERS))
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)
    lines = ["| model | build | choices | worst cosine / SNR dB (OpenVINO f32) | CPU ms (default) | latency / NNCF's |",
             "|---|---|---|---|---|---|"]
    for name in args.models:
        with tempfile.TemporaryDirectory(prefix=f"qdeploy-ov-seven-bit-{name}-") as tmp:
            lines += run_model(name, Path(tmp), args.rounds)
    print("\n".join([machine_line(), "", *lines]))


if __name__ == "__main__":
    main()
