"""Helpers of the robustness suite: run the CLI as a user would and read what it left."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import onnx
from typer.testing import CliRunner

from qdeploy.cli import app
from qdeploy.pipeline.publish.store import META_FILE
from tests.helpers.models import tiny_cnn, write_recipe

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
    """`qdeploy ARGS` in a fresh interpreter; `code` runs before the CLI (to inject faults), in the same process:
    `qdeploy run` is not supervised then (qdeploy.cli.supervise would run the recipe in a child without it)."""
    prelude = code or ""
    script = (f"{prelude}\nfrom qdeploy.cli import main\nimport sys\n"
              f"sys.argv = ['qdeploy', *{list(args)!r}]\nmain()\n")
    env = {**os.environ, "QDEPLOY_NO_SUPERVISOR": "1"} if code else None
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=timeout, env=env)


def recipe_with_model(folder: Path, model: onnx.ModelProto | bytes | None = None, *, body: str = RECIPE,
                      model_name: str = "model.onnx") -> Path:
    target = folder / model_name
    if isinstance(model, bytes):
        target.write_bytes(model)
    else:
        onnx.save(model if model is not None else tiny_cnn(), target)
    return write_recipe(folder, body.replace("MODEL", model_name))


def qdeploy(*args: str) -> tuple[int, str]:
    """(exit status, stderr) of `qdeploy ARGS` in this process; an exception escaping the CLI fails the test."""
    result = CliRunner().invoke(app, list(args))
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result.exit_code, result.stderr


def assert_exit_2(outcome: tuple[int, str], *needles: str) -> None:
    code, stderr = outcome
    assert code == 2, (code, stderr)
    assert "internal error" not in stderr and "Traceback" not in stderr, stderr
    for needle in needles:
        assert needle in stderr, (needle, stderr)


def assert_clean_input_error(result: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert result.returncode == 2, (result.returncode, result.stderr[-2000:])
    assert "Traceback" not in result.stderr, result.stderr[-2000:]
    for needle in needles:
        assert needle in result.stderr, (needle, result.stderr[-2000:])


def sha256_of(path: Path) -> str:
    """What `sha256sum` prints for a file (independent of qdeploy's own hashing)."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


def assert_published_consistent(out: Path) -> dict[str, Any] | None:
    """The published folder says the truth: every file report.json names exists with the sha256 it states,
    artifacts/ holds nothing the report does not describe, and SHA256SUMS agrees.  Returns the report."""
    report_path, artifacts = out / "report.json", out / "artifacts"
    if not report_path.exists():
        assert not artifacts.exists() or not any(artifacts.iterdir()), "artifacts published without a report"
        return None
    report = json.loads(report_path.read_text())
    described = set()
    for row in report["artifacts"]:
        assert Path(row["path"]).parts[-2:] == ("artifacts", f"{row['name']}.onnx"), row["path"]
        model, sidecar = artifacts / f"{row['name']}.onnx", artifacts / Path(row["sidecar"]).name
        assert sha256_of(model) == row["sha256"], (row["name"], "model hash")
        assert json.loads(sidecar.read_text())["sha256"] == row["sha256"], row["name"]
        described |= {model.name, sidecar.name}
        for data in row.get("external_data", []):
            assert sha256_of(artifacts / data["file"]) == data["sha256"], (row["name"], data["file"])
            described.add(data["file"])
    present = {path.name for path in artifacts.iterdir()} - {"SHA256SUMS"} if artifacts.exists() else set()
    assert present == described, (present, described)
    if artifacts.exists():
        for line in (artifacts / "SHA256SUMS").read_text().splitlines():
            digest, name = line.split("  ", 1)
            assert sha256_of(artifacts / name) == digest, name
    return report


def assert_cache_sound(cache: Path) -> None:
    """Every complete cache entry's files have the sha256 its sidecar records."""
    for meta_path in cache.glob(f"*/*/{META_FILE}"):
        meta = json.loads(meta_path.read_text())
        for name, record in meta["files"].items():
            assert sha256_of(meta_path.parent / name) == record["sha256"], (meta_path, name)





BODY = """
name: r
model: {onnx: MODEL}
data:
  calib: {reader: random, samples: 4}
variants:
  fp32: [simplify]
  fp16: [simplify, fp16]
  int8: [simplify, {quantize: {calibration: {data: calib}}}]
targets: [ort:cpu]
validate: {reference: fp32, samples: 2}
benchmark: {warmup: 0, iterations: 2, rounds: 1}
"""


def killer(module: str, function: str, when: str, calls: int = 1) -> str:
    """Python run before the CLI: the chosen function SIGKILLs the process on its n-th call."""
    return f"""
import importlib, os, signal
_module = importlib.import_module({module!r})
_original = getattr(_module, {function!r})
_count = [0]
def _patched(*args, **kwargs):
    _count[0] += 1
    if {when!r} == "before" and _count[0] >= {calls}:
        os.kill(os.getpid(), signal.SIGKILL)
    result = _original(*args, **kwargs)
    if {when!r} == "after" and _count[0] >= {calls}:
        os.kill(os.getpid(), signal.SIGKILL)
    return result
setattr(_module, {function!r}, _patched)
"""
