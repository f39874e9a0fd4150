"""The whole recipe on the ONNX wheel's own old model files: PyTorch 0.3's (IR 3, opset 6 or 9) and Caffe2's.

    python benchmarks/onnx_wheel_models.py [--sets pytorch-converted pytorch-operator light] [--match PReLU]
                                           [--work DIR] [--timeout 300]

Each file runs as a user runs it, ``qdeploy run recipe.yaml`` in its own process (variants fp32 ``[simplify]``,
fp16 ``[simplify, fp16]``, int8 ``[simplify, quantize]`` PTQ on seeded random data; targets ort:cpu and
openvino:cpu; a short latency benchmark).  A file refused because ONNX Runtime dropped one of its op versions is
run again with ``model.opset: 13``, as the error tells the user.  One line per file that did not pass (its exit
code, its failures and failed rows), then a count per outcome.  The light Caffe2 files carry made-up weights
(ConstantOfShape): their fp16 rows under true float16 arithmetic overflow, which counts as a failed row here.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

import onnx

DATA = Path(onnx.__file__).parent / "backend" / "test" / "data"
RECIPE = """name: one
model:
  onnx: model.onnx{opset}
variants:
  fp32: [simplify]
  fp16: [simplify, fp16]
  int8: [simplify, {{quantize: {{mode: ptq}}}}]
targets: [ort:cpu, openvino:cpu]
benchmark: {{iterations: 5, warmup: 1, mode: latency}}
report: {{formats: [json]}}
"""
CONVERT_HINT = "set `model.opset: 13`"


def run_one(model: Path, folder: Path, timeout: int) -> tuple[str, str]:
    """(outcome, what failed) of one file through the recipe, converted to opset 13 when the error says so."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "model.onnx").write_bytes(model.read_bytes())
    outcome, detail = _run(folder, "", timeout)
    if CONVERT_HINT in detail:
        outcome, detail = _run(folder, "\n  opset: 13", timeout)
        outcome = f"opset 13: {outcome}"
    return outcome, detail


def _run(folder: Path, opset: str, timeout: int) -> tuple[str, str]:
    (folder / "recipe.yaml").write_text(RECIPE.format(opset=opset))
    try:
        done = subprocess.run([sys.executable, "-m", "qdeploy", "run", "-q", "--no-cache", "recipe.yaml"],
                              cwd=folder, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return "timed out", ""
    report = folder / "runs" / "one" / "report.json"
    if not report.exists():
        return f"exit {done.returncode}", " ".join(done.stderr.split())[-300:]
    data = json.loads(report.read_text())
    failed = [f"{row['variant']}@{row['target']}: {row['status']}" for row in data["validation"]
              if row["status"] not in ("passed", "unavailable")]
    failed += [f"{entry['variant']} {entry['stage']}: {entry['reason'][:120]}" for entry in data["failures"]]
    return ("passed" if done.returncode == 0 else f"exit {done.returncode}"), "; ".join(failed)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sets", nargs="+", default=["pytorch-converted", "pytorch-operator", "light"])
    parser.add_argument("--match", default="", help="only files whose folder or name holds this")
    parser.add_argument("--work", type=Path, default=None)
    parser.add_argument("--timeout", type=int, default=300)
    args = parser.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="qdeploy-onnx-wheel-"))
    models = [path for name in args.sets for path in sorted((DATA / name).glob("**/*.onnx"))
              if args.match in str(path.relative_to(DATA))]
    outcomes: Counter[str] = Counter()
    print(f"{len(models)} files of onnx {onnx.__version__}; work folder {work}")
    for model in models:
        label = model.parent.name if model.name == "model.onnx" else model.stem
        outcome, detail = run_one(model, work / label, args.timeout)
        outcomes[outcome.split(":")[0] if outcome.startswith("exit") else outcome] += 1
        if outcome not in ("passed", "opset 13: passed"):
            print(f"| {label} | {outcome} | {detail} |", flush=True)
    print("\n| outcome | files |\n|---|---|")
    for outcome, count in outcomes.most_common():
        print(f"| {outcome} | {count} |")


if __name__ == "__main__":
    main()
