"""What each way of calling ONNX Runtime costs on a small model: the choice behind the benchmark's timed call.

The benchmark binds inputs once and keeps outputs bound (``OrtBoundCall``), except for a model whose declared
output shape contradicts the real one: an output left bound keeps the previous run's buffer, which ORT checks
against the declaration, so such a model fails its second run; its outputs are bound again before every run.
This script times, interleaved over `--repeats` rounds, the median latency of: IOBinding with outputs kept
bound, IOBinding with outputs re-bound each run, ``InferenceSession.run`` and ``run_with_ort_values``.

    python benchmarks/ort_bound_call.py --channels 16 --size 32 --repeats 7
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def calls(path: Path, feeds: dict[str, np.ndarray]) -> dict[str, Callable[[], object]]:
    import onnxruntime as ort

    from qdeploy.targets import OrtBoundCall

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    names = [output.name for output in session.get_outputs()]
    kept = session.io_binding()
    for name, value in feeds.items():
        kept.bind_cpu_input(name, value)
    for name in names:
        kept.bind_output(name, "cpu")
    values = {name: ort.OrtValue.ortvalue_from_numpy(value) for name, value in feeds.items()}
    rebound = OrtBoundCall(session, feeds, names, rebind_outputs=True)  # the mode a wrong declaration switches on
    return {
        "IOBinding, outputs kept bound": lambda: session.run_with_iobinding(kept),
        "IOBinding, outputs re-bound each run": rebound.run,
        "InferenceSession.run": lambda: session.run(names, feeds),
        "run_with_ort_values": lambda: session.run_with_ort_values(names, values),
    }


def median_us(call: Callable[[], object], runs: int) -> float:
    for _ in range(runs // 10):
        call()
    latencies = []
    for _ in range(runs):
        start = time.perf_counter_ns()
        call()
        latencies.append(time.perf_counter_ns() - start)
    return statistics.median(latencies) / 1e3


def main() -> None:
    import onnx

    from tests.helpers.models import tiny_cnn

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--channels", type=int, default=16)
    parser.add_argument("--size", type=int, default=32)
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "cnn.onnx"
        onnx.save(tiny_cnn(channels=args.channels, size=args.size), path)
        feeds = {"input": np.random.default_rng(0).standard_normal((1, 3, args.size, args.size)).astype(np.float32)}
        table = calls(path, feeds)
        medians: dict[str, list[float]] = {name: [] for name in table}
        for _ in range(args.repeats):
            for name, call in table.items():
                medians[name].append(median_us(call, args.runs))
    print(f"tiny CNN, {args.channels} channels, {args.size}x{args.size}, 1 thread; median of {args.repeats} "
          f"interleaved repeats of {args.runs} runs")
    print(f"| {'call':40} | p50 us | repeats' range us |")
    print(f"|{'-' * 42}|--------|-------------------|")
    for name, values in medians.items():
        print(f"| {name:40} | {statistics.median(values):6.1f} | {min(values):6.1f} - {max(values):6.1f}   |")


if __name__ == "__main__":
    main()
