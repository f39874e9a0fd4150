"""Wall time of a sweep of small recipes: one after the other versus each executor.

Builds N small CNN recipes (fp32, fp16 and int8 on ort:cpu and openvino:cpu, short benchmarks) in a temporary
folder, then runs them

- sequentially: ``run_recipe`` in a loop in this process, and `qdeploy run` once per recipe (a shell loop),
- with the local executor (worker processes, benchmarks alone),
- with the Ray executor on a Ray started here (its start is timed apart), when ray is installed,

each from an empty cache, and prints one table: wall seconds, speedup over sequential, and the number of times a
benchmark overlapped other work (must be 0).

    python benchmarks/sweep.py                      # 8 recipes, every executor
    python benchmarks/sweep.py --recipes 8 --workers 2 --skip-ray
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

RECIPE = """
name: bench-{index}
model: {{onnx: model-{index}.onnx}}
data:
  calib: {{reader: random, samples: 16, seed: 1}}
variants:
  fp32: [simplify]
  fp16: [simplify, {{fp16: {{keep_io_types: true}}}}]
  int8: [simplify, {{quantize: {{mode: ptq, calibration: {{data: calib}}}}}}]
targets: [ort:cpu, openvino:cpu]
validate: {{reference: fp32, samples: 4}}
benchmark: {{batch_sizes: [1], warmup: 5, iterations: 40, rounds: 2}}
"""


def write_recipes(folder: Path, count: int) -> list[Path]:
    import onnx

    from tests.helpers.models import tiny_cnn

    paths = []
    for index in range(count):
        onnx.save(tiny_cnn(seed=index, channels=32, size=64), folder / f"model-{index}.onnx")
        path = folder / f"recipe-{index}.yaml"
        path.write_text(textwrap.dedent(RECIPE.format(index=index)).lstrip())
        paths.append(path)
    return paths


def sequential(paths: list[Path], out: Path) -> tuple[float, int]:
    """Wall seconds and how many recipes passed."""
    from qdeploy.pipeline.recipe.loader import load_recipe_file
    from qdeploy.pipeline.run.runner import RunOptions, run_recipe

    started = time.perf_counter()
    passed = 0
    for path in paths:
        recipe = load_recipe_file(path)
        passed += run_recipe(recipe, RunOptions(out_dir=out / recipe.name, show_progress=False)).exit_code == 0
    return time.perf_counter() - started, passed


def cli_loop(paths: list[Path], out: Path) -> tuple[float, int]:
    """`qdeploy run` once per recipe, as a shell loop would: each pays the start of Python and the imports."""
    import subprocess

    started = time.perf_counter()
    passed = 0
    for path in paths:
        command = [sys.executable, "-m", "qdeploy", "run", str(path), "--out", str(out / path.stem), "-q"]
        passed += subprocess.run(command, cwd=REPO, check=False).returncode == 0
    return time.perf_counter() - started, passed


def swept(paths: list[Path], out: Path, executor: str, workers: int | None) -> tuple[float, dict[str, Any]]:
    from qdeploy.pipeline.sweep import load_sweep
    from qdeploy.pipeline.sweep.executors import SweepOptions, run_sweep

    options = SweepOptions(out_dir=out, executor=executor, workers=workers,  # type: ignore[arg-type]
                           lock_path=out / "work.lock")
    started = time.perf_counter()
    result = run_sweep(load_sweep(paths), options)
    return time.perf_counter() - started, result.report


def overlaps(timeline: list[dict[str, Any]]) -> int:
    count = 0
    for bench in (r for r in timeline if r["kind"] == "benchmark"):
        count += sum(1 for other in timeline if other is not bench and other["node"] == bench["node"]
                     and other["start"] < bench["end"] and bench["start"] < other["end"])
    return count


def ray_start_seconds() -> float | None:
    """Time to start (and stop) a Ray of this machine, reported apart from the Ray sweep."""
    try:
        import ray
    except ImportError:
        return None
    started = time.perf_counter()
    ray.init(include_dashboard=False, log_to_driver=False, object_store_memory=256 << 20)
    seconds = time.perf_counter() - started
    ray.shutdown()
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--recipes", type=int, default=8, help="How many recipes.")
    parser.add_argument("--workers", type=int, default=None, help="Local executor workers [default: the cores].")
    parser.add_argument("--skip-ray", action="store_true", help="Leave the Ray executor out.")
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)
    from qdeploy.pipeline.results.envinfo import cpu_info

    rows: list[tuple[str, float, int, int | None]] = []
    with tempfile.TemporaryDirectory(prefix="qdeploy-sweep-bench-") as tmp:
        folder = Path(tmp)
        paths = write_recipes(folder, args.recipes)
        rows.append(("sequential: run_recipe loop in one process", *sequential(paths, folder / "seq"), None))
        rows.append(("sequential: `qdeploy run` per recipe", *cli_loop(paths, folder / "cli"), None))
        seconds, report = swept(paths, folder / "local", "local", args.workers)
        rows.append((f"local executor ({report['executor']['workers']} workers)", seconds,
                     report["counts"]["passed"], overlaps(report["timeline"])))
        ray_start = None if args.skip_ray else ray_start_seconds()
        if ray_start is not None:
            seconds, report = swept(paths, folder / "ray", "ray", None)
            passed, clashes = report["counts"]["passed"], overlaps(report["timeline"])
            rows.append(("ray executor (Ray started here, start included)", seconds, passed, clashes))
            rows.append(("ray executor, Ray start excluded", seconds - ray_start, passed, clashes))
    cpu = cpu_info()
    print(f"{args.recipes} recipes (3 variants x 2 targets each) on {cpu['model']}, {cpu['cores']} cores")
    print("| mode | wall s | vs sequential | recipes passed | benchmark overlaps |")
    print("|---|---|---|---|---|")
    base = rows[0][1]
    for mode, seconds, passed, clashes in rows:
        print(f"| {mode} | {seconds:.1f} | {base / seconds:.2f}x | {passed}/{args.recipes} | "
              f"{'–' if clashes is None else clashes} |")
    if any(passed != args.recipes for _, _, passed, _ in rows):
        print("WARNING: some recipes did not pass; their times do not compare (see the reports)")
    if ray_start is not None:
        print(f"Ray start on this machine: {ray_start:.1f} s")


if __name__ == "__main__":
    main()
