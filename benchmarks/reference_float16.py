"""reference:cpu on float16 models: qdeploy's evaluator (``qdeploy.targets.evaluator``) before and after its
float16 Conv, MatMul and Gemm products moved to float32 BLAS (rounded to float16 once, as numpy's float16 loops
round them): seconds per sample and how far apart their outputs are.  "Before" is onnx's evaluator with qdeploy's
other corrected kernels (BatchNormalization before opset 14 among them), so the outputs differ only by the move.

    python benchmarks/reference_float16.py MODEL.onnx [MODEL.onnx ...] [--runs 1] [--dims height=128 ...]

Each model must hold float16 (an fp16 artifact: ``runs/<name>/artifacts/fp16.onnx``).  Inputs are seeded uniform
[0, 1) values in the model's input shapes (a symbolic dimension as ``--dims`` names it, else 1; integer inputs
0).  Prints one row per model: the three op types that take longest in qdeploy's evaluator, the seconds per sample
of each (the best of ``--runs``), and the SNR of after's outputs against before's (the same float16 steps taken in
another summation order).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from qdeploy.graph.utils import graph_inputs  # noqa: E402
from qdeploy.targets.evaluator import FLOAT16_BY_BLAS, build_evaluator, corrected_kernels, run_evaluator  # noqa: E402


def _feeds(model: Any, dims: dict[str, int]) -> dict[str, np.ndarray]:
    from onnx import helper

    rng = np.random.default_rng(0)
    feeds = {}
    for value in graph_inputs(model.graph):
        tensor = value.type.tensor_type
        shape = [dim.dim_value if dim.HasField("dim_value") else dims.get(dim.dim_param, 1) for dim in tensor.shape.dim]
        dtype = helper.tensor_dtype_to_np_dtype(tensor.elem_type)
        feeds[value.name] = rng.uniform(0, 1, shape).astype(dtype) if np.issubdtype(dtype, np.floating) \
            else np.zeros(shape, dtype)
    return feeds


def _timed(evaluator: Any, feeds: dict[str, np.ndarray], runs: int) -> tuple[float, list[np.ndarray]]:
    best, outputs = float("inf"), []
    for _ in range(runs):
        started = time.perf_counter()
        with np.errstate(all="ignore"):
            outputs = evaluator.run(None, feeds)
        best = min(best, time.perf_counter() - started)
    return best, [np.asarray(output) for output in outputs]


def _by_op(evaluator: Any, feeds: dict[str, np.ndarray]) -> Counter[str]:
    """Seconds per op type in one run of ``evaluator``."""
    spent: Counter[str] = Counter()
    for node in evaluator.rt_nodes_:
        def timed(*args: Any, _run: Any = node.run, _op: str = node.op_type, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return _run(*args, **kwargs)
            finally:
                spent[_op] += time.perf_counter() - started
        node.run = timed
    run_evaluator(evaluator, feeds)
    return spent


def _snr_db(got: list[np.ndarray], want: list[np.ndarray]) -> float:
    signal = sum(float(np.sum(np.asarray(w, np.float64) ** 2)) for w in want)
    noise = sum(float(np.sum((np.asarray(g, np.float64) - np.asarray(w, np.float64)) ** 2))
                for g, w in zip(got, want, strict=True))
    return float("inf") if noise == 0 else 10 * np.log10(signal / noise)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("models", nargs="+", type=Path)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--dims", nargs="*", default=[], metavar="NAME=VALUE", help="symbolic dimensions' values")
    args = parser.parse_args()
    dims = {name: int(value) for name, value in (item.split("=", 1) for item in args.dims)}

    import onnx
    from onnx.reference import ReferenceEvaluator

    print("| model | slowest ops after (s) | before s/sample | after s/sample | faster | SNR dB between |")
    print("|---|---|---|---|---|---|")
    for path in args.models:
        model = onnx.load(str(path))
        feeds = _feeds(model, dims)
        before = [kernel for kernel in corrected_kernels(model) if kernel.__name__ not in FLOAT16_BY_BLAS]
        before_s, before_out = _timed(ReferenceEvaluator(model, new_ops=before), feeds, args.runs)
        after_s, after_out = _timed(build_evaluator(model), feeds, args.runs)
        slowest = ", ".join(f"{op} {seconds:.1f}" for op, seconds in _by_op(build_evaluator(model), feeds)
                            .most_common(3))
        print(f"| {path} | {slowest} | {before_s:.1f} | {after_s:.1f} | {before_s / after_s:.1f}x | "
              f"{_snr_db(after_out, before_out):.1f} |", flush=True)


if __name__ == "__main__":
    main()
