"""NNCF's default int8 graphs before and after qdeploy moves their int8 pairs at Concats to uint8.

    python benchmarks/nncf_concat.py [--models pp-ocr-det pp-ocr-rec demo] [--iterations 20] [--rounds 5]

Per model of ``benchmarks/int8.py``: NNCF's ``nncf.quantize`` with its defaults, and the same graph after
``stages/quantize/ptq/_concat_uint8.py`` (what ``engine: nncf`` ships where OpenVINO runs the graph).  The table
prints how many pairs moved, the worst cosine against fp32 on ONNX Runtime and on OpenVINO pinned to f32 (each
against the fp32 model on the same runtime), whether ONNX Runtime's outputs stay bit for bit the same, and the
median latency in ms (OpenVINO pinned to f32 and at its default precision).  On an AVX512-VNNI CPU without AMX,
OpenVINO miscomputes a convolution reading a Concat of int8 tensors (``benchmarks/openvino_concat.py``).
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

import numpy as np
import onnx

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.int8 import BUILDERS, Row, latency, nncf_rows, outputs, print_model_table  # noqa: E402
from qdeploy.core.compare import compare_outputs  # noqa: E402
from qdeploy.core.tolerance import Tolerance  # noqa: E402
from qdeploy.stages.quantize.ptq._concat_uint8 import uint8_at_concats  # noqa: E402


def _worst_cosine(reference: list, path: Path, samples: list, target: str) -> float:
    return compare_outputs(reference, outputs(path, samples, target), Tolerance()).worst()["cosine"]


def _identical(first: list, second: list) -> bool:
    return all(np.array_equal(one[name], two[name]) for one, two in zip(first, second, strict=True) for name in one)


def model_lines(name: str, folder: Path, iterations: int, rounds: int) -> list[str]:
    case = BUILDERS[name](folder)
    if case is None:
        return [f"| {name} | not available here | | | | |"]
    references = {target: outputs(case.path, case.evaluation, target) for target in ("ort:cpu", "openvino:cpu")}
    lines = []
    for row in nncf_rows(case, folder):
        model = onnx.load(str(row.path))
        moved = uint8_at_concats(model)
        rewritten = folder / f"{row.path.stem}-uint8-at-concats.onnx"
        onnx.save(model, str(rewritten))
        timed = [Row(name, row.artifact, row.path, 0.0), Row(name, f"{row.artifact} uint8", rewritten, 0.0)]
        latency(timed, case.evaluation[0], iterations, rounds, None)
        same = _identical(outputs(row.path, case.evaluation), outputs(rewritten, case.evaluation))
        for timing in timed:
            cosines = [_worst_cosine(references[target], timing.path, case.evaluation, target)
                       for target in ("ort:cpu", "openvino:cpu")]
            times = " / ".join(f"{timing.latency.get(column, float('nan')):.2f}"
                               for column in ("ort:cpu", "openvino:cpu", "openvino:cpu default"))
            lines.append(f"| {name} | {timing.artifact} | {moved if timing.path == rewritten else ''} | "
                         f"{cosines[0]:.4f} / {cosines[1]:.4f} | {'yes' if same else 'no'} | {times} |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["pp-ocr-det", "pp-ocr-rec", "demo"], choices=list(BUILDERS))
    parser.add_argument("--iterations", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)
    header = ["| model | graph | pairs moved | worst cosine ORT / OpenVINO f32 | ORT outputs the same | "
             "ms ORT / OpenVINO f32 / OpenVINO default |", "|---|---|---|---|---|---|"]
    print_model_table(header, args.models, "qdeploy-nncf-concat-", model_lines, args.iterations, args.rounds)


if __name__ == "__main__":
    main()
