"""How each stage's time grows with the node count: chains and real-shaped graphs of 1k to 100k nodes.

    python benchmarks/scaling.py [--sizes 1000 5000 20000 100000] [--shapes chain conv transformer]
                                 [--stages export simplify fp16 ptq dynamic validate] [--timeout 900]
                                 [--markdown table.md]

Models come from ``benchmarks/scaling_models.py`` (a MatMul/Tanh chain, residual
conv blocks, transformer-like MatMul/Add/Softmax/LayerNorm blocks).  Every stage
runs with its default settings (quantize: seeded random calibration data,
int8 kernels counted on ort:cpu and openvino:cpu; validate: fp32, fp16 and
int8 artifacts on ort:cpu), each in its own child process that is stopped after
``--timeout`` seconds (a stage that times out is not run at larger sizes).  Export
reads the generated ONNX file; simplify reads export's output; fp16, ptq and
dynamic read simplify's output.

Each cell is the stage's ``run`` time in seconds; in parentheses, the part spent
creating ONNX Runtime sessions and compiling OpenVINO models (graph resolution and
the runtimes' own graph transformers: a third-party cost, which grows faster than
linearly on QDQ and float16 graphs in ONNX Runtime); ``growth`` is the exponent k
of time ~ n^k between the two largest sizes that finished, for the stage and for
its own part (the stage minus the runtimes' session creation and compilation).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

log = logging.getLogger("benchmarks.scaling")

STAGES = ("export", "simplify", "fp16", "ptq", "dynamic", "validate")
INPUT_OF = {"export": "source", "simplify": "export", "fp16": "simplify", "ptq": "simplify", "dynamic": "simplify"}


def run_child(stage: str, folder: Path) -> dict[str, Any]:
    """In the child process: run one stage on the files in folder, write its output model, return timings."""
    import onnxruntime as ort
    import openvino

    from benchmarks.scaling_stages import run_stage

    session_seconds = [0.0]

    def timing(original: Any) -> Any:
        def timed(self: Any, *args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return original(self, *args, **kwargs)
            finally:
                session_seconds[0] += time.perf_counter() - started
        return timed

    ort.InferenceSession._create_inference_session = timing(  # type: ignore[method-assign]
        ort.InferenceSession._create_inference_session)
    openvino.Core.compile_model = timing(openvino.Core.compile_model)  # type: ignore[method-assign]
    started = time.perf_counter()
    nodes = run_stage(stage, folder)
    seconds = time.perf_counter() - started
    return {"seconds": seconds, "session_seconds": session_seconds[0], "nodes_out": nodes}


def measure(stage: str, folder: Path, timeout: float) -> dict[str, Any]:
    """One stage in a child process; {'error': ...} when it fails or runs past the timeout."""
    command = [sys.executable, str(Path(__file__).resolve()), "--child", stage, "--folder", str(folder)]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return {"error": f"> {timeout:.0f} s"}
    if done.returncode != 0:
        return {"error": (done.stderr.strip().splitlines() or ["failed"])[-1][:120]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def growth(points: list[tuple[int, float]]) -> str:
    """k in time ~ n^k between the two largest sizes (times under 0.05 s are too noisy to tell)."""
    if len(points) < 2 or points[-2][1] < 0.05:
        return "-"
    (n1, t1), (n2, t2) = points[-2], points[-1]
    return f"{math.log(max(t2, 1e-9) / t1) / math.log(n2 / n1):.2f}"


def table(results: dict[tuple[str, str, int], dict[str, Any]], shapes: list[str], stages: list[str],
          sizes: list[int]) -> str:
    columns = " | ".join(f"{size:,} nodes (runtimes)" for size in sizes)
    header = f"| shape | stage | {columns} | growth | own growth |"
    lines = [header, "|" + "---|" * (len(sizes) + 4)]
    for shape in shapes:
        for stage in stages:
            cells, total, own = [], [], []
            for size in sizes:
                result = results.get((shape, stage, size))
                if result is None:
                    cells.append("not run")
                elif "error" in result:
                    cells.append(result["error"])
                else:
                    cells.append(f"{result['seconds']:.1f} ({result['session_seconds']:.1f})")
                    total.append((size, result["seconds"]))
                    own.append((size, result["seconds"] - result["session_seconds"]))
            lines.append(f"| {shape} | {stage} | " + " | ".join(cells) + f" | {growth(total)} | {growth(own)} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 5000, 20000, 100000])
    parser.add_argument("--shapes", nargs="+", default=["chain", "conv", "transformer"])
    parser.add_argument("--stages", nargs="+", default=list(STAGES), choices=STAGES)
    parser.add_argument("--timeout", type=float, default=900.0, help="Seconds one stage may take (per size).")
    parser.add_argument("--markdown", type=Path, help="Also write the table to this file.")
    parser.add_argument("--child", choices=STAGES, help=argparse.SUPPRESS)
    parser.add_argument("--folder", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    if args.child:
        print(json.dumps(run_child(args.child, args.folder)))
        return 0
    return run_all(args)


def run_all(args: argparse.Namespace) -> int:
    import onnx

    from benchmarks.scaling_models import SHAPES

    results: dict[tuple[str, str, int], dict[str, Any]] = {}
    given_up: set[tuple[str, str]] = set()
    with tempfile.TemporaryDirectory(prefix="qdeploy-scaling-") as tmp:
        for shape in args.shapes:
            for size in sorted(args.sizes):
                folder = Path(tmp) / f"{shape}-{size}"
                folder.mkdir()
                onnx.save(SHAPES[shape](size), str(folder / "source.onnx"))
                for stage in args.stages:
                    needed = INPUT_OF.get(stage)
                    if (shape, stage) in given_up or (needed and not (folder / f"{needed}.onnx").exists()):
                        continue
                    results[(shape, stage, size)] = measure(stage, folder, args.timeout)
                    log.warning("%s %s %d: %s", shape, stage, size, results[(shape, stage, size)])
                    if "error" in results[(shape, stage, size)]:
                        given_up.add((shape, stage))
    text = table(results, args.shapes, args.stages, sorted(args.sizes))
    print(text)
    if args.markdown:
        args.markdown.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
