"""A model read and compiled by OpenVINO on CPU in a child process, where compiling it might crash the process.

OpenVINO's CPU plugin has ended the process on some graphs, not with an exception but with a segmentation fault
in ``compile_model`` (an LSTM reading a dequantized Concat, PyThaiNLP's thai2rom decoder).  In the run's own
process that ends the run with no report; compiled here first, in a child process (``qdeploy.core.child_worker``:
one kept for small models), it fails one artifact with the reason.  The read
goes through ``read_onnx``, as every OpenVINO target reads the file.
"""

from __future__ import annotations

import functools
import importlib.util
from pathlib import Path
from typing import Any

from qdeploy.core.child_worker import WORKER_MAX_BYTES, call_isolated
from qdeploy.core.files import bytes_on_disk
from qdeploy.core.fresh_python import FreshPythonError
from qdeploy.targets.openvino_read import read_onnx

__all__ = ["CRASHED", "NOT_INSTALLED", "compile_crash", "openvino_failure"]

NOT_INSTALLED = "not checked: openvino is not installed (pip install openvino)"
CRASHED = "OpenVINO crashed reading or compiling it for CPU"


def openvino_failure(path: Path, model_bytes: int | None = None) -> tuple[str, str] | None:
    """None when OpenVINO reads the model at ``path`` and compiles it on CPU; else (step, message): step "read",
    "compile", "crash" (the child process died: ``CRASHED`` and how, in the message) or "not checked" (openvino
    missing, or the child failed before it could try).  ``model_bytes``: its size on disk, when known."""
    if importlib.util.find_spec("openvino") is None:
        return "not checked", NOT_INSTALLED
    size = bytes_on_disk(path) if model_bytes is None else model_bytes
    try:
        result = call_isolated(__name__, "compile_here", {"path": str(path)}, model_bytes=size)
    except FreshPythonError as exc:
        if exc.signal is None:  # the child failed outside OpenVINO: not checked
            return "not checked", f"not checked: the OpenVINO check could not run: {exc}"
        return "crash", f"{CRASHED} (the process ended with signal {exc.signal}): an OpenVINO bug, not a wrong model"
    if result.get("step") is None:
        return None
    return str(result["step"]), str(result["message"])


def compile_crash(path: Path) -> str | None:
    """Why OpenVINO's CPU plugin ends a process reading or compiling the model at ``path`` (checked once per version
    of the file, in the worker child); None when it does not, and, unchecked, for a model above
    ``WORKER_MAX_BYTES``, which a child of its own would compile twice.  What a target asks before compiling a file
    in this process: the publishing guard checks the artifacts a stage writes, this the ones it did not see (the
    exported model)."""
    try:
        stat = Path(path).stat()
    except OSError:  # absent: the read that follows says so
        return None
    return _crash(str(path), stat.st_size, stat.st_mtime_ns)


@functools.lru_cache(maxsize=256)
def _crash(path: str, size: int, modified_ns: int) -> str | None:
    model_bytes = bytes_on_disk(Path(path))
    if model_bytes > WORKER_MAX_BYTES:
        return None
    failure = openvino_failure(Path(path), model_bytes)
    return failure[1] if failure is not None and failure[0] == "crash" else None


def compile_here(payload: dict[str, Any]) -> dict[str, Any]:
    """The child's side: read as the targets read, compile on CPU at the device's defaults."""
    import openvino

    core = openvino.Core()
    try:
        model, _ = read_onnx(core, Path(payload["path"]))
    except Exception as exc:  # the parent words the failure
        return {"step": "read", "message": str(exc)}
    try:
        core.compile_model(model, "CPU")
    except Exception as exc:
        return {"step": "compile", "message": str(exc)}
    return {"step": None}
