"""Does qdeploy's benchmark harness measure what OpenVINO's own benchmark_app measures?

Both run the same artifacts (the demo's fp32 and int8 by default) on openvino:cpu with the same settings:
synchronous API, one infer request, one stream, PERFORMANCE_HINT LATENCY, INFERENCE_PRECISION_HINT f32, the
same number of threads, the same warm-up and iteration counts.  The two are alternated `--repeats` times so
drift of the machine hits both alike; the table shows each side's median of medians and the median of the
per-repeat ratios (qdeploy / benchmark_app, each taken from back-to-back runs).  Goal: within 10%.

`--mode throughput` (or `both`) compares the throughput mode instead (benchmarks/harness_fidelity_throughput.py):
benchmark_app -hint throughput against qdeploy's OpenVINO request pool, inferences/s and latency at that load.
The machine may be shared: every table records the one-minute load average of its rounds.

    python benchmarks/harness_fidelity.py                   # builds the demo artifacts in a temporary folder
    python benchmarks/harness_fidelity.py --run runs/demo-cnn --variant fp32 --variant int8
    python benchmarks/harness_fidelity.py --run runs/demo-cnn --mode both --seconds 3 --repeats 10

benchmark_app ships with the openvino wheel as the `benchmark_app` console script
(openvino.tools.benchmark.main); the script says so and stops if it is missing.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from qdeploy.core.rows import BenchmarkRow

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def loadavg() -> float:
    """One-minute load average: the machine may be shared, so every table records it."""
    return float(Path("/proc/loadavg").read_text().split()[0])


def benchmark_app_command() -> list[str]:
    """The benchmark_app entry point of the installed openvino wheel."""
    beside = Path(sys.executable).with_name("benchmark_app")
    if beside.is_file():
        return [str(beside)]
    found = shutil.which("benchmark_app")
    if found:
        return [found]
    try:
        import openvino.tools.benchmark.main  # noqa: F401
    except ImportError:
        raise SystemExit("benchmark_app is not installed: this openvino wheel lacks openvino.tools.benchmark") from None
    return [sys.executable, "-c", "import sys; from openvino.tools.benchmark.main import main; sys.exit(main())"]


def run_benchmark_app(model: Path, threads: int, warmup: int, iterations: int, work: Path) -> dict[str, float]:
    """benchmark_app's median, mean and min latency (ms) for one model, settings pinned through -load_config.

    benchmark_app refuses -nstreams/-nthreads together with -hint latency (a rule of its command line, not of
    OpenVINO), so the hint, streams, threads and precision go in a config file with -hint none.  Its own
    warm-up is a single first inference; `warmup` extra untimed runs are not possible there, so it gets
    `warmup + iterations` iterations and we compare medians, which the first runs barely move.
    """
    config = work / "ov_config.json"
    config.write_text(json.dumps({"CPU": {"PERFORMANCE_HINT": "LATENCY", "NUM_STREAMS": "1",
                                          "INFERENCE_NUM_THREADS": str(threads),
                                          "INFERENCE_PRECISION_HINT": "f32"}}))
    report_dir = work / "ba_report"
    report_dir.mkdir(exist_ok=True)
    command = [*benchmark_app_command(), "-m", str(model), "-d", "CPU", "-hint", "none", "-api", "sync",
               "-load_config", str(config), "-niter", str(warmup + iterations), "-report_type", "no_counters",
               "-report_folder", str(report_dir), "-json_stats"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, check=False)
    if done.returncode != 0:
        raise SystemExit(f"benchmark_app failed ({done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    results = json.loads((report_dir / "benchmark_report.json").read_text())["execution_results"]
    return {"p50": float(results["latency (ms)"]), "mean": float(results["avg latency"]),
            "min": float(results["min latency"])}


def run_qdeploy(model: Path, threads: int, warmup: int, iterations: int) -> BenchmarkRow:
    """qdeploy's benchmark stage on one artifact, one round, on openvino:cpu."""
    from qdeploy.calibration import data_context
    from qdeploy.core.context import Artifact
    from qdeploy.stages.benchmark import BenchmarkConfig
    from qdeploy.stages.benchmark import run as benchmark

    artifact = Artifact(path=model, sidecar=model.with_suffix(".json"), key="fidelity", sha256="", size_bytes=0,
                        stages=(), parent=None)
    config = BenchmarkConfig(warmup=warmup, iterations=iterations, rounds=1, threads=threads)
    [row] = benchmark({"model": artifact}, ["openvino:cpu"], config, data_context("*", model.parent))
    if row.status != "ok":
        raise SystemExit(f"qdeploy benchmark of {model} failed: {row.reason}")
    return row


def demo_artifacts(work: Path, variants: list[str]) -> dict[str, Path]:
    """Build the demo recipe's artifacts (cached under `work`) and return their published paths."""
    from qdeploy.pipeline.recipe.loader import load_recipe_file
    from qdeploy.pipeline.run.runner import RunOptions, run_recipe

    recipe = load_recipe_file(REPO / "recipes" / "demo.yaml")
    recipe.benchmark.enabled = False
    wanted = sorted({name.partition("@")[0] for name in variants})  # int8@openvino: the recipe's int8, split
    result = run_recipe(recipe, RunOptions(out_dir=work / "demo", variants=wanted, targets=["openvino:cpu"],
                                           show_progress=False))
    return {name: result.out_dir / "artifacts" / f"{name}.onnx" for name in variants}


def measure(models: dict[str, Path], args: argparse.Namespace, work: Path) -> list[dict[str, Any]]:
    rows = []
    for name, model in models.items():
        app, ours, settings, loads = [], [], {}, []
        for _ in range(args.repeats):  # alternate the two so drift hits both alike
            loads.append(loadavg())
            app.append(run_benchmark_app(model, args.threads, args.warmup, args.iterations, work)["p50"])
            row = run_qdeploy(model, args.threads, args.warmup, args.iterations)
            ours.append(row.p50)
            settings = row.settings or {}
        ratios = [mine / theirs for mine, theirs in zip(ours, app, strict=True)]
        rows.append({"artifact": name, "benchmark_app_ms": statistics.median(app),
                     "qdeploy_ms": statistics.median(ours),
                     "ratio": statistics.median(ratios), "ratios": ratios, "app_runs": app, "qdeploy_runs": ours,
                     "settings": settings, "loads": loads})
    return rows


def print_table(rows: list[dict[str, Any]], args: argparse.Namespace) -> None:
    print(f"openvino:cpu, sync, 1 request, 1 stream, PERFORMANCE_HINT LATENCY, f32, {args.threads} threads, "
          f"{args.warmup} warm-up + {args.iterations} timed runs, median of {args.repeats} alternated repeats")
    print()
    print("| artifact | benchmark_app p50 ms | qdeploy p50 ms | ratio qdeploy/benchmark_app (median of repeats) "
          "| load avg | within 10% |")
    print("|---|---|---|---|---|---|")
    for row in rows:
        ok = "yes" if abs(row["ratio"] - 1.0) <= 0.10 else "NO"
        print(f"| {row['artifact']} | {row['benchmark_app_ms']:.3f} | {row['qdeploy_ms']:.3f} | "
              f"{row['ratio']:.3f} | {min(row['loads']):.2f}–{max(row['loads']):.2f} | {ok} |")
    print()
    for row in rows:
        print(f"{row['artifact']}: per repeat, benchmark_app p50 {[round(v, 3) for v in row['app_runs']]}, qdeploy "
              f"{[round(v, 3) for v in row['qdeploy_runs']]}, ratio {[round(v, 3) for v in row['ratios']]}")
    if rows:
        print(f"qdeploy's compiled model reports {rows[-1]['settings']}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", type=Path, help="An existing qdeploy run folder (its artifacts/ are measured).")
    parser.add_argument("--variant", action="append", help="Variants to measure (default: fp32 and int8@openvino).")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="Inference threads of both.")
    parser.add_argument("--warmup", type=int, default=50, help="Untimed runs before measuring.")
    parser.add_argument("--iterations", type=int, default=300, help="Timed runs per repeat.")
    parser.add_argument("--repeats", type=int, default=5, help="Alternated repeats of both harnesses.")
    parser.add_argument("--mode", choices=("latency", "throughput", "both"), default="latency",
                        help="Compare the latency mode, the throughput mode, or both.")
    parser.add_argument("--seconds", type=float, default=3.0, help="Throughput: timed seconds of each side per round.")
    parser.add_argument("--fresh", action="store_true",
                        help="Throughput: run qdeploy's side in a new process per round, as benchmark_app runs.")
    args = parser.parse_args()
    variants = args.variant or ["fp32", "int8@openvino"]
    with tempfile.TemporaryDirectory(prefix="qdeploy-fidelity-") as tmp:
        work = Path(tmp)
        if args.run:
            models = {name: args.run / "artifacts" / f"{name}.onnx" for name in variants}
            missing = [str(path) for path in models.values() if not path.is_file()]
            if missing:
                raise SystemExit(f"not found: {', '.join(missing)}")
        else:
            models = demo_artifacts(work, variants)
        if args.mode in ("latency", "both"):
            print_table(measure(models, args, work), args)
        if args.mode in ("throughput", "both"):
            from benchmarks.harness_fidelity_throughput import measure_throughput, print_throughput_table

            print_throughput_table(measure_throughput(models, benchmark_app_command(), args, work), args)


if __name__ == "__main__":
    main()
