"""What ``quantize.reduce_range`` costs and saves, on this CPU and under exact int8 arithmetic (what VNNI computes).

    python benchmarks/int8_paths.py [--models demo resnet18 encoder pp-ocr-det pp-ocr-rec] [--iterations 20]

For each model (built by ``benchmarks/int8.py``'s builders, calibrated and evaluated on different samples) and
each setting (false: full-range int8; weights: 7-bit weights; activations: 7-bit uint8 activations; auto: the
better of the two on calibration data), the table prints the worst cosine against fp32 of:
- ``exact``: ONNX Runtime with its graph optimizations off (DequantizeLinear -> float op -> QuantizeLinear): the
  graph's exact int8 arithmetic, which is what CPUs with VNNI (and arm64) compute with the fused kernels;
- ``ort:cpu`` and ``openvino:cpu``: what this CPU's fused int8 kernels compute (they saturate without VNNI);
and the median latency on both runtimes (7-bit operands run the same kernels: no speed cost is expected).
The header says which int8 path this CPU takes.
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
import warnings
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

import int8 as bench  # noqa: E402  (benchmarks/int8.py: models, data, timing)

from qdeploy.core.compare import compare_outputs  # noqa: E402
from qdeploy.core.tolerance import Tolerance  # noqa: E402
from qdeploy.stages.quantize import QuantizeConfig  # noqa: E402
from qdeploy.targets.int8_path import int8_path  # noqa: E402

SETTINGS = (False, "weights", "activations", "auto")


def exact_outputs(path: Path, samples: bench.Samples) -> bench.Samples:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    names = [output.name for output in session.get_outputs()]
    return [dict(zip(names, session.run(names, sample), strict=True)) for sample in samples]


def target_outputs(path: Path, target: str, samples: bench.Samples) -> bench.Samples:
    with bench.get_target(target).load(path) as session:
        return [session.run(sample) for sample in samples]


def worst_cosine(reference: bench.Samples, candidate: bench.Samples) -> float:
    return float(compare_outputs(reference, candidate, Tolerance()).worst()["cosine"])


def measure(case: bench.Case, folder: Path, iterations: int) -> list[str]:
    calibration = {"data": "calib", "samples": len(case.calib)}
    rows = [bench.qdeploy(case, folder, f"rr-{setting}", QuantizeConfig(calibration=calibration,
                                                                         reduce_range=setting, verify_targets=[]))
            for setting in SETTINGS]
    reference = bench.outputs(case.path, case.evaluation)
    bench.latency(rows, case.evaluation[0], iterations, rounds=3, threads=None)
    lines = []
    for setting, row in zip(SETTINGS, rows, strict=True):
        exact = worst_cosine(reference, exact_outputs(row.path, case.evaluation))
        fused = {target: worst_cosine(reference, target_outputs(row.path, target, case.evaluation))
                 for target in bench.TARGETS}
        latency = " | ".join(f"{row.latency.get(target, float('nan')):.2f}" for target in bench.TARGETS)
        lines.append(f"| {case.name} | {setting} | {exact:.4f} | {fused['ort:cpu']:.4f} | "
                     f"{fused['openvino:cpu']:.4f} | {latency} | {row.seconds:.1f} |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["demo", "resnet18"], choices=sorted(bench.BUILDERS))
    parser.add_argument("--iterations", type=int, default=20)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    warnings.filterwarnings("ignore")
    path = int8_path()
    print(f"this CPU's int8 path: {path.kind} ({path.meaning})\n")
    print("| model | reduce_range | exact (= VNNI) cosine | ort:cpu here | openvino:cpu here | ort ms | ov ms "
          "| build s |")
    print("|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as work:
        for name in args.models:
            case = bench.BUILDERS[name](Path(work))
            if case is not None:
                for line in measure(case, Path(work), args.iterations):
                    print(line, flush=True)


if __name__ == "__main__":
    main()
