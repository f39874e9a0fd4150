"""OpenVINO's read and compile of a file in a child process first (``qdeploy.targets.openvino_probe``): its CPU
plugin has ended the process on some graphs, and in the run's own process that ended the run with no report."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import onnx
import pytest

from qdeploy.core.errors import ModelError
from qdeploy.targets import openvino_probe
from tests.helpers.fresh import crashing_on
from tests.helpers.models import tiny_cnn

pytest.importorskip("openvino")


@pytest.fixture(autouse=True)
def _fresh_cache() -> None:
    openvino_probe._crash.cache_clear()


def _model(tmp_path: Path, name: str = "model.onnx") -> Path:
    path = tmp_path / name
    onnx.save(tiny_cnn(), path)
    return path


def test_a_model_that_compiles_has_no_failure_and_a_crash_is_said(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    path = _model(tmp_path)
    assert openvino_probe.openvino_failure(path) is None and openvino_probe.compile_crash(path) is None
    monkeypatch.setattr(openvino_probe, "call_isolated", crashing_on("model.onnx", "openvino"))
    step, message = openvino_probe.openvino_failure(path)
    assert step == "crash" and "OpenVINO crashed reading or compiling it" in message and "signal 11" in message


def test_each_version_of_a_file_is_compiled_once_and_large_ones_not_at_all(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    crash = crashing_on("model.onnx", "openvino")

    def counted(module: str, function: str, payload: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        calls.append(payload["path"])
        return crash(module, function, payload, **kwargs)

    monkeypatch.setattr(openvino_probe, "call_isolated", counted)
    path = _model(tmp_path)
    assert "crashed" in openvino_probe.compile_crash(path) and "crashed" in openvino_probe.compile_crash(path)
    assert len(calls) == 1
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 1_000_000))  # a new version
    openvino_probe.compile_crash(path)
    assert len(calls) == 2
    monkeypatch.setattr(openvino_probe, "WORKER_MAX_BYTES", 10)
    assert openvino_probe.compile_crash(_model(tmp_path, "large.onnx")) is None and len(calls) == 2


def test_the_openvino_target_refuses_to_compile_a_file_that_crashed_the_child(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from qdeploy.targets import get_target

    monkeypatch.setattr(openvino_probe, "call_isolated", crashing_on("model.onnx", "openvino"))
    with pytest.raises(ModelError, match=r"model.onnx: OpenVINO crashed reading or compiling it for CPU"):
        get_target("openvino:cpu").load(_model(tmp_path))
