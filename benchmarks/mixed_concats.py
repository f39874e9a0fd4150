"""OpenVINO's int8 graph before and after three placement rules, beside NNCF (docs/openvino-placement.md).

    python benchmarks/mixed_concats.py [--models word-segmenter demo orientation pp-ocr-rec] [--rounds 9]

The rules: a Concat of very different ranges stays float (``ptq/_mixed_concats.py``); data movement that reaches
int8 compute only through a float op stays float; a Relu's output is quantized in front of the Transpose/Reshape
that leads to int8 compute (``ptq/_openvino.py``).  ``before`` builds ``runtime: openvino`` with the three switched
off, ``after`` with today's code, both from one calibration (16 samples, minmax); ``nncf`` is ``nncf.quantize``
with its defaults on the same samples.  Models: ``benchmarks/int8_models.py``'s (the word segmenter and the page
models need ``python -m tests.real_models``).  Cosine: the worst over the evaluation samples against the float
model, both on OpenVINO pinned to f32.  Latency: OpenVINO at its default precision, 1 thread, CPU time per call,
median over rounds that interleave the artifacts (``benchmarks/openvino_placement.py``'s ``measure``).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.int8_models import BUILDERS  # noqa: E402
from benchmarks.int8_peers import nncf_artifacts  # noqa: E402
from benchmarks.openvino_placement import build_replacing, measure  # noqa: E402
from qdeploy.graph.utils import node_readers  # noqa: E402
from qdeploy.stages.quantize.ptq import _openvino, _ptq  # noqa: E402
from qdeploy.stages.quantize.ptq._prepare import prepare  # noqa: E402


def _float_tail_before(model: Any, op_types: list[str], excluded: Any = ()) -> list[str]:
    """The tail rule before: only nodes from which no compute node can be reached at all."""
    feeds = _openvino.reaching_compute(model, node_readers(model.graph.node), lambda node: True)
    return [node.name for node in model.graph.node
            if node.op_type in op_types and node.op_type not in _openvino.COMPUTE_OPS and node.name not in feeds]


_BEFORE = {"float_tail": _float_tail_before, "moved_before_quantizing": lambda *args, **kwargs: set(),
           "mixed_range_concats": lambda *args, **kwargs: {}}


def build(prepared: Path, ranges: dict, path: Path, *, before: bool) -> Path:
    return build_replacing(prepared, ranges, path, _BEFORE if before else {}, signed_int8=_ptq.CENTRED)


def run_model(name: str, folder: Path, rounds: int) -> list[str]:
    case = BUILDERS[name](folder)
    if case is None:
        return [f"| {name} | (missing: python -m tests.real_models) | | | |"]
    prepared = prepare(case.path, folder).path
    ranges, _ = _ptq.calibrate(prepared, list(_ptq.BALANCED_OP_TYPES), lambda: iter(case.calib), folder, "minmax",
                               99.999)
    models = {"fp32": case.path, "before": build(prepared, ranges, folder / "before.onnx", before=True),
              "after": build(prepared, ranges, folder / "after.onnx", before=False)}
    built, note = nncf_artifacts(case.path, case.calib, folder, transformer=False)
    models.update({label: path for label, path, _ in built})
    results = measure(models, case.evaluation[:8], rounds)
    base = results.get("nncf", results["before"])[1]
    return [f"| {name} | {label} | {cosine:.4f} | {ms:.2f} | {ms / base:.3f} |"
            for label, (cosine, ms) in results.items()] + ([f"| {name} | ({note}) | | | |"] if note else [])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=["word-segmenter", "demo", "orientation", "pp-ocr-rec"],
                        choices=list(BUILDERS))
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args()
    lines = ["| model | build | worst cosine (OpenVINO f32) | CPU ms (default precision) | latency / NNCF's |",
             "|---|---|---|---|---|"]
    for name in args.models:
        with tempfile.TemporaryDirectory(prefix=f"qdeploy-mixed-concats-{name}-") as tmp:
            lines += run_model(name, Path(tmp), args.rounds)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
