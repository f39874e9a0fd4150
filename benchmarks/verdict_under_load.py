"""Does the verdict hold on a busy machine?  The demo recipe once on a quiet machine, then `--busy-runs` times with
one core kept busy by another process (a Python busy loop, as another job on a CI runner would be).

Per target, each run's verdict (what it ships, or "undecided: machine busy") and the shipped speedup are printed
beside the quiet run's.  A busy run passes when its verdict matches the quiet one or says it is undecided, and its
shipped speedup is within 25% of the quiet run's.  The artifacts are built once (a shared cache); every run
validates and benchmarks afresh.

    python benchmarks/verdict_under_load.py                       # the demo recipe, 1 quiet + 3 busy runs
    python benchmarks/verdict_under_load.py --recipe my.yaml --busy-runs 5
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
BURN = "import time\nend = time.time() + {seconds}\nwhile time.time() < end:\n    pass\n"


def loadavg() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


def run_once(recipe: Path, out: Path, cache: Path) -> dict[str, Any]:
    """One `qdeploy run` in its own process; its report's verdict and how long it took."""
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "qdeploy", "run", str(recipe), "--out", str(out), "--cache-dir",
                           str(cache), "-q"], capture_output=True, text=True, check=False)
    if done.returncode not in (0, 1):
        raise SystemExit(f"qdeploy run failed ({done.returncode}): {done.stderr[-2000:]}")
    report = json.loads((out / "report.json").read_text())
    return {"verdict": report["verdict"]["targets"], "seconds": time.perf_counter() - started,
            "exit": done.returncode}


def busy_run(recipe: Path, out: Path, cache: Path) -> dict[str, Any]:
    """One run with another process keeping one core busy the whole time."""
    burner = subprocess.Popen([sys.executable, "-c", BURN.format(seconds=3600)])
    try:
        time.sleep(1.0)
        load = loadavg()
        result = run_once(recipe, out, cache)
    finally:
        burner.kill()
        burner.wait()
    return {**result, "load": load}


def shipped(verdict: dict[str, Any]) -> tuple[str, float | None, bool]:
    """(what ships, its speedup against the reference, whether the verdict was decided)."""
    if verdict.get("status") != "ship":
        return "nothing", None, True
    return verdict["variant"], verdict.get("speedup"), verdict.get("decided", True)


def judge(quiet: dict[str, Any], busy: dict[str, Any]) -> str:
    variant, speedup, _ = shipped(quiet)
    theirs, their_speedup, decided = shipped(busy)
    if not decided:
        return "undecided: machine busy (allowed)"
    if theirs != variant:
        return "DIFFERENT VERDICT"
    if speedup and their_speedup and abs(their_speedup / speedup - 1) > 0.25:
        return f"speedup moved {their_speedup / speedup - 1:+.0%} (over 25%)"
    return "same"


def print_table(quiet: dict[str, Any], busy: list[dict[str, Any]]) -> None:
    print(f"quiet run: load {quiet['load']:.2f}, {quiet['seconds']:.0f} s; busy runs (one core kept busy): "
          + ", ".join(f"load {r['load']:.2f}, {r['seconds']:.0f} s" for r in busy))
    print()
    print("| target | run | ships | decided | speedup | against the quiet run |")
    print("|---|---|---|---|---|---|")
    for target, verdict in quiet["verdict"].items():
        variant, speedup, _ = shipped(verdict)
        print(f"| {target} | quiet | {variant} | yes | {speedup or 0:.2f}x | - |")
        for index, run in enumerate(busy, 1):
            theirs = run["verdict"].get(target, {})
            other, their_speedup, decided = shipped(theirs)
            print(f"| {target} | busy {index} | {other} | {'yes' if decided else 'no'} | {their_speedup or 0:.2f}x | "
                  f"{judge(verdict, theirs)} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--recipe", type=Path, default=REPO / "recipes" / "demo.yaml")
    parser.add_argument("--busy-runs", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="qdeploy-verdict-load-") as tmp:
        work = Path(tmp)
        cache = work / "cache"
        run_once(args.recipe, work / "warm", cache)  # builds the artifacts once: every measured run reuses them
        quiet = {**run_once(args.recipe, work / "quiet", cache), "load": loadavg()}
        busy = [busy_run(args.recipe, work / f"busy{index}", cache) for index in range(args.busy_runs)]
        print_table(quiet, busy)


if __name__ == "__main__":
    main()
