"""Throughput half of benchmarks/harness_fidelity.py: qdeploy's OpenVINO request pool against
`benchmark_app -hint throughput`, same artifact, same input sample, same precision pin (f32), same seconds.

Each round runs benchmark_app, then ours, back to back, and records the one-minute load average before it; the
verdict is the median of the per-round ratios (ours / benchmark_app), never one round: on a shared machine a
single round can be off by ±50%.  `--fresh` runs our side in a new process per round, as benchmark_app runs.
"""

from __future__ import annotations

import json
import re
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parent.parent


def loadavg() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


def sample_input(model: Path, work: Path) -> tuple[str, Path]:
    """A seeded sample at the model's (static) input shape, saved for benchmark_app's -i."""
    import onnx

    graph = onnx.load(str(model), load_external_data=False).graph
    initializers = {init.name for init in graph.initializer}
    [value] = [value for value in graph.input if value.name not in initializers]
    shape = [dim.dim_value or 1 for dim in value.type.tensor_type.shape.dim]
    path = work / "input.npy"
    np.save(path, np.random.default_rng(0).standard_normal(shape).astype(np.float32))
    return value.name, path


def benchmark_app_throughput(command: list[str], model: Path, npy: Path, seconds: float,
                             work: Path) -> dict[str, Any]:
    """benchmark_app's own numbers from its JSON report."""
    report_dir = work / "ba_tput"
    report_dir.mkdir(exist_ok=True)
    args = [*command, "-m", str(model), "-d", "CPU", "-hint", "throughput", "-t", f"{seconds:g}", "-i", str(npy),
            "-ip", "f32", "-infer_precision", "f32", "-report_type", "no_counters", "-report_folder",
            str(report_dir), "-json_stats"]
    done = subprocess.run(args, capture_output=True, text=True, timeout=600, check=False)
    if done.returncode != 0:
        raise SystemExit(f"benchmark_app failed ({done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    results = json.loads((report_dir / "benchmark_report.json").read_text())["execution_results"]
    requests = re.search(r"(\d+) inference requests", done.stdout)
    return {"inferences_per_s": float(results["throughput"]), "p50": float(results["latency (ms)"]),
            "requests": int(requests.group(1)) if requests else None}


def qdeploy_throughput(model: Path, name: str, npy: Path, seconds: float, warmup: float) -> dict[str, Any]:
    """qdeploy's pool (what `benchmark.mode: throughput` runs on openvino:cpu), one window of `seconds`."""
    sys.path.insert(0, str(REPO))
    from qdeploy.stages.benchmark._throughput import summarize
    from qdeploy.targets.pool import open_pool

    pool = open_pool("openvino:cpu", model, {name: np.load(npy)}, None)
    try:
        pool.run_for(warmup)
        summary = summarize([pool.run_for(seconds)], batch=1)
        return {"inferences_per_s": summary["inferences_per_s"], "p50": summary["latency_ms"]["p50"],
                "requests": pool.requests, "settings": pool.settings()}
    finally:
        pool.close()


def qdeploy_fresh(model: Path, name: str, npy: Path, seconds: float, warmup: float) -> dict[str, Any]:
    """The same in a new process, as benchmark_app runs."""
    code = ("import json, sys; from pathlib import Path; sys.path.insert(0, sys.argv[1]); "
            "from benchmarks.harness_fidelity_throughput import qdeploy_throughput as q; "
            "print(json.dumps(q(Path(sys.argv[2]), sys.argv[3], Path(sys.argv[4]), float(sys.argv[5]), "
            "float(sys.argv[6]))))")
    done = subprocess.run([sys.executable, "-c", code, str(REPO), str(model), name, str(npy), str(seconds),
                           str(warmup)], capture_output=True, text=True, timeout=600, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def measure_throughput(models: dict[str, Path], command: list[str], args: Any, work: Path) -> list[dict[str, Any]]:
    rows = []
    ours_fn = qdeploy_fresh if args.fresh else qdeploy_throughput
    for artifact, model in models.items():
        name, npy = sample_input(model, work)
        rounds = []
        for _ in range(args.repeats):  # alternate the two so drift hits both alike
            load = loadavg()
            app = benchmark_app_throughput(command, model, npy, args.seconds, work)
            ours = ours_fn(model, name, npy, args.seconds, 1.0)
            rounds.append({"load": load, "app": app, "ours": ours})
        rows.append({"artifact": artifact, "rounds": rounds})
    return rows


def print_throughput_table(rows: list[dict[str, Any]], args: Any) -> None:
    where = "a fresh process per round" if args.fresh else "this process"
    print(f"\nopenvino:cpu throughput: benchmark_app -hint throughput -t {args.seconds:g} -infer_precision f32 "
          f"against qdeploy's pool (PERFORMANCE_HINT THROUGHPUT, AsyncInferQueue, f32) in {where}; "
          f"{args.repeats} alternated rounds")
    print()
    print("| artifact | benchmark_app inf/s | qdeploy inf/s | ratio (median of rounds) | round ratios min–max "
          "| p50 ms at load: app / qdeploy (ratio) | requests app / qdeploy | load avg | within 10% |")
    print("|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        rounds = row["rounds"]
        ratios = [r["ours"]["inferences_per_s"] / r["app"]["inferences_per_s"] for r in rounds]
        p50_ratios = [r["ours"]["p50"] / r["app"]["p50"] for r in rounds]
        app_p50 = statistics.median(r["app"]["p50"] for r in rounds)
        our_p50 = statistics.median(r["ours"]["p50"] for r in rounds)
        loads = [r["load"] for r in rounds]
        ratio = statistics.median(ratios)
        print(f"| {row['artifact']} | {statistics.median(r['app']['inferences_per_s'] for r in rounds):.1f} | "
              f"{statistics.median(r['ours']['inferences_per_s'] for r in rounds):.1f} | {ratio:.3f} | "
              f"{min(ratios):.2f}–{max(ratios):.2f} | {app_p50:.2f} / {our_p50:.2f} "
              f"({statistics.median(p50_ratios):.3f}) | {rounds[0]['app']['requests']} / "
              f"{rounds[0]['ours']['requests']} | {min(loads):.2f}–{max(loads):.2f} | "
              f"{'yes' if abs(ratio - 1) <= 0.10 else 'NO'} |")
    if rows:
        print(f"\nqdeploy's compiled model reports {rows[-1]['rounds'][-1]['ours']['settings']}")
