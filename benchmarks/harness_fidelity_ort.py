"""Does qdeploy's benchmark harness measure what ONNX Runtime's own plain loop measures, with every artifact of a
run timed in alternating rounds as a run times them?

The qdeploy side is the benchmark stage over all the artifacts at once on ort:cpu (interleaved rounds, each turn
isolated from the session timed before it).  ONNX Runtime's side is a plain loop over one InferenceSession with
its default options, in a fresh process with nothing else alive, on the same file and the same inputs.  The two
are alternated `--repeats` times; the table shows each side's median of medians and the median ratio.  Goal:
within 5%.  Every repeat records the one-minute load average and the cores other processes used while qdeploy
timed (a repeat on a busy machine is marked, and left out of the verdict column when quiet repeats exist).

    python benchmarks/harness_fidelity_ort.py                     # the demo's fp32, fp16 and int8@ort
    python benchmarks/harness_fidelity_ort.py --run runs/demo-cnn --variant fp32 --variant int8@ort
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

PLAIN_LOOP = """
import json, sys, time, statistics
import numpy as np, onnxruntime as ort
model, feeds, warmup, runs = sys.argv[1], np.load(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
session = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
feed = {name: feeds[name] for name in feeds.files}
for _ in range(warmup):
    session.run(None, feed)
times = []
for _ in range(runs):
    start = time.perf_counter_ns()
    session.run(None, feed)
    times.append((time.perf_counter_ns() - start) / 1e6)
print(json.dumps({"p50": statistics.median(times)}))
"""


def loadavg() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


def harness(models: dict[str, Path], args: argparse.Namespace) -> dict[str, Any]:
    """qdeploy's benchmark stage over every artifact at once on ort:cpu: p50 per artifact and the machine load."""
    from qdeploy.calibration import data_context
    from qdeploy.core.context import Artifact
    from qdeploy.stages.benchmark import BenchmarkConfig
    from qdeploy.stages.benchmark import run as benchmark

    artifacts = {name: Artifact(path=path, sidecar=path.with_suffix(".json"), key=name, sha256="", size_bytes=0,
                                stages=(), parent=None) for name, path in models.items()}
    config = BenchmarkConfig(warmup=args.warmup, iterations=args.iterations, rounds=args.rounds, busy_seconds=0)
    rows = benchmark(artifacts, ["ort:cpu"], config, data_context("*", Path(tempfile.gettempdir())))
    failed = [f"{row.variant}: {row.reason}" for row in rows if row.status != "ok"]
    if failed:
        raise SystemExit("qdeploy's benchmark failed: " + "; ".join(failed))
    return {"p50": {row.variant: row.p50 for row in rows}, "machine": rows[0].machine_load or {}}


def plain_loop(model: Path, feeds: Path, args: argparse.Namespace) -> float:
    """ONNX Runtime's own plain loop in a fresh process: its median (ms)."""
    done = subprocess.run([sys.executable, "-c", PLAIN_LOOP, str(model), str(feeds), str(args.warmup),
                           str(args.iterations)], capture_output=True, text=True, timeout=600, check=True)
    return float(json.loads(done.stdout.strip().splitlines()[-1])["p50"])


def same_inputs(model: Path, work: Path) -> Path:
    """The feed the harness times (its seeded data for the model's inputs), saved for the plain loop."""
    from qdeploy.calibration import data_context
    from qdeploy.stages.benchmark._data import read_data

    data = read_data(data_context("*", work), None, model, [1])
    path = work / f"{model.stem}-feed.npz"
    np.savez(path, **data.batch_for(model, 1).feed)
    return path


def demo_artifacts(work: Path, variants: list[str]) -> dict[str, Path]:
    from qdeploy.pipeline.recipe.loader import load_recipe_file
    from qdeploy.pipeline.run.runner import RunOptions, run_recipe

    recipe = load_recipe_file(REPO / "recipes" / "demo.yaml")
    recipe.benchmark.enabled = False
    wanted = sorted({name.partition("@")[0] for name in variants})
    result = run_recipe(recipe, RunOptions(out_dir=work / "demo", variants=wanted, targets=["ort:cpu"],
                                           show_progress=False))
    return {name: result.out_dir / "artifacts" / f"{name}.onnx" for name in variants}


def measure(models: dict[str, Path], args: argparse.Namespace, work: Path) -> list[dict[str, Any]]:
    feeds = {name: same_inputs(path, work) for name, path in models.items()}
    repeats = []
    for _ in range(args.repeats):  # alternate the two sides so drift hits both alike
        ours = harness(models, args)
        theirs = {name: plain_loop(path, feeds[name], args) for name, path in models.items()}
        repeats.append({"ours": ours["p50"], "theirs": theirs, "load": loadavg(),
                        "other_cores": ours["machine"].get("other_cores"), "busy": ours["machine"].get("busy")})
    return repeats


def print_table(repeats: list[dict[str, Any]], names: list[str], args: argparse.Namespace) -> None:
    quiet = [r for r in repeats if not r["busy"]] or repeats
    print(f"ort:cpu, ONNX Runtime's default options (threads: one per physical core), {args.warmup} warm-up + "
          f"{args.iterations} timed runs, qdeploy in {args.rounds} interleaved rounds over {len(names)} artifacts; "
          f"{len(repeats)} alternated repeats, {len([r for r in repeats if not r['busy']])} on a quiet machine")
    print()
    print("| artifact | plain loop p50 ms | qdeploy p50 ms | ratio qdeploy/plain (quiet repeats) | within 5% |")
    print("|---|---|---|---|---|")
    for name in names:
        ratios = [r["ours"][name] / r["theirs"][name] for r in quiet]
        ratio = statistics.median(ratios)
        print(f"| {name} | {statistics.median(r['theirs'][name] for r in quiet):.3f} | "
              f"{statistics.median(r['ours'][name] for r in quiet):.3f} | {ratio:.3f} | "
              f"{'yes' if abs(ratio - 1) <= 0.05 else 'NO'} |")
    print()
    for index, r in enumerate(repeats, 1):
        cells = ", ".join(f"{name} {r['ours'][name]:.3f}/{r['theirs'][name]:.3f}" for name in names)
        print(f"repeat {index}: load {r['load']:.2f}, other processes {r['other_cores'] or 0:.2f} cores"
              f"{' (busy)' if r['busy'] else ''}: qdeploy/plain ms {cells}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", type=Path, help="An existing qdeploy run folder (its artifacts/ are measured).")
    parser.add_argument("--variant", action="append", help="Variants (default: fp32, fp16, int8@ort).")
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--iterations", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    variants = args.variant or ["fp32", "fp16", "int8@ort"]
    with tempfile.TemporaryDirectory(prefix="qdeploy-fidelity-ort-") as tmp:
        work = Path(tmp)
        models = ({name: args.run / "artifacts" / f"{name}.onnx" for name in variants} if args.run
                  else demo_artifacts(work, variants))
        missing = [str(path) for path in models.values() if not path.is_file()]
        if missing:
            raise SystemExit(f"not found: {', '.join(missing)}")
        print_table(measure(models, args, work), variants, args)


if __name__ == "__main__":
    main()
