"""Real models nobody here wrote, for tests and benchmarks: PP-OCR det/rec/cls from the rapidocr-onnxruntime wheel.

The wheel (Apache-2.0, on PyPI) ships Paddle-exported ONNX models with their
weights in Constant nodes.  They are looked for in ``$QDEPLOY_REAL_MODELS``
(a folder), else in ``~/.cache/qdeploy/test-models``, in the wheel's own
layout ``rapidocr_onnxruntime/models/<file>.onnx``.  When missing, they are
fetched once with ``pip download`` and unzipped there; when that fails too,
the calling test is skipped with the reason.  Nothing is committed.

CI prefills the folder (see .ci/run); the command never fails, the tests skip:

    export QDEPLOY_REAL_MODELS="${QDEPLOY_REAL_MODELS:-$HOME/.cache/qdeploy/test-models}"
    python -m tests.real_models
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

WHEEL = "rapidocr-onnxruntime==1.4.4"
MODELS_IN_WHEEL = "rapidocr_onnxruntime/models/"
PP_OCR_DET = "rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx"
PP_OCR_REC = "rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx"
PP_OCR_CLS = "rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx"
DEFAULT_CACHE = Path.home() / ".cache" / "qdeploy" / "test-models"


def real_model_dir() -> Path:
    """The folder real models live in: ``$QDEPLOY_REAL_MODELS`` or the default cache."""
    configured = os.environ.get("QDEPLOY_REAL_MODELS")
    return Path(configured).expanduser() if configured else DEFAULT_CACHE


def real_model(relative_name: str) -> Path:
    """Path of a real model (e.g. ``PP_OCR_DET``), fetched on first use; pytest.skip when it cannot be had."""
    path = real_model_dir() / relative_name
    if path.is_file():
        return path
    problem = fetch(real_model_dir())
    if path.is_file():
        return path
    import pytest

    pytest.skip(f"real model {relative_name} is not in {real_model_dir()} and could not be fetched "
                f"({problem or 'the wheel does not contain it'}); set QDEPLOY_REAL_MODELS to a folder holding "
                f"{MODELS_IN_WHEEL}*.onnx or allow `pip download {WHEEL}`")
    raise AssertionError("unreachable")  # pytest.skip raises


def fetch(folder: Path) -> str:
    """Download the wheel and unzip its models into ``folder``; '' on success, else what went wrong."""
    with tempfile.TemporaryDirectory(prefix="qdeploy-wheel-") as tmp:
        command = [sys.executable, "-m", "pip", "download", WHEEL, "--no-deps", "--quiet", "-d", tmp]
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"pip download failed: {exc}"
        if done.returncode != 0:
            return f"pip download failed: {done.stderr.strip()[-300:]}"
        wheels = sorted(Path(tmp).glob("*.whl"))
        if not wheels:
            return "pip download produced no wheel"
        return _unzip_models(wheels[0], folder)


def _unzip_models(wheel: Path, folder: Path) -> str:
    """Extract the wheel's models, each through a temporary name so a killed run leaves no half file."""
    try:
        with zipfile.ZipFile(wheel) as archive:
            names = [name for name in archive.namelist() if name.startswith(MODELS_IN_WHEEL)
                     and name.endswith(".onnx")]
            for name in names:
                target = folder / name
                target.parent.mkdir(parents=True, exist_ok=True)
                partial = target.with_suffix(".partial")
                partial.write_bytes(archive.read(name))
                partial.replace(target)
    except (OSError, zipfile.BadZipFile) as exc:
        return f"cannot unzip {wheel.name}: {exc}"
    return "" if names else f"{wheel.name} holds no {MODELS_IN_WHEEL}*.onnx"


if __name__ == "__main__":  # prefill for CI: python -m tests.real_models (never fails: the tests skip instead)
    target = real_model_dir()
    missing = [name for name in (PP_OCR_DET, PP_OCR_REC, PP_OCR_CLS) if not (target / name).is_file()]
    problem = fetch(target) if missing else ""
    print(f"real models in {target}: " + (f"unavailable ({problem}); their tests will be skipped" if problem
                                             else "ready"))
