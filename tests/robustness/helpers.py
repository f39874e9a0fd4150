"""Helpers of the robustness suite: run the CLI as a user would and read what it left."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import onnx

from tests.conftest import tiny_cnn, write_recipe

RECIPE = """
name: r
model: {onnx: MODEL}
data:
  calib: {reader: random, samples: 4}
variants:
  fp32: [simplify]
  int8: [simplify, {quantize: {calibration: {data: calib}}}]
targets: [ort:cpu]
validate: {reference: fp32, samples: 2}
benchmark: {enabled: false}
"""


def run_cli(*args: str, code: str | None = None, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """`qdeploy ARGS` in a fresh interpreter; `code` runs before the CLI (to inject faults)."""
    prelude = code or ""
    script = f"{prelude}\nfrom pipeline.cli import main\nimport sys\nsys.argv = ['qdeploy', *{list(args)!r}]\nmain()\n"
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=timeout)


def recipe_with_model(folder: Path, model: onnx.ModelProto | bytes | None = None, *, body: str = RECIPE,
                      model_name: str = "model.onnx") -> Path:
    target = folder / model_name
    if isinstance(model, bytes):
        target.write_bytes(model)
    else:
        onnx.save(model if model is not None else tiny_cnn(), target)
    return write_recipe(folder, body.replace("MODEL", model_name))


def assert_clean_input_error(result: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert result.returncode == 2, (result.returncode, result.stderr[-2000:])
    assert "Traceback" not in result.stderr, result.stderr[-2000:]
    for needle in needles:
        assert needle in result.stderr, (needle, result.stderr[-2000:])
