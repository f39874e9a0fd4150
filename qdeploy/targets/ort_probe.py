"""A model loaded in ONNX Runtime in a child process first, where loading it might crash the process.

Some graphs crash ONNX Runtime's CPU provider while it optimizes them at session creation, not with an error but
with a segmentation fault: a float16 MatMul fed by a Transpose of its batch axes, at ORT_ENABLE_ALL, in ONNX
Runtime 1.32 (its MatMul-Transpose fusion makes a float16 FusedMatMul that the NCHWc transformer then trips on;
microsoft/onnxruntime#15494 is a float16 ResNet that did the same).  In the run's own process that ends the run
with no report; loaded here first, in a child process (``qdeploy.core.child_worker``: one kept for small
models), it fails one variant with the reason.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from qdeploy.core.child_worker import call_isolated
from qdeploy.core.files import bytes_on_disk
from qdeploy.core.fresh_python import FreshPythonError

if TYPE_CHECKING:
    import onnx

__all__ = ["load_error"]


def load_error(source: Path | onnx.ModelProto) -> str | None:
    """None when ONNX Runtime's CPU provider loads the model (a file, or one in memory, written to a temporary file
    for the child) with its default session options, else why not: its exception, or the crash that ended the
    child process."""
    if not isinstance(source, Path):
        with tempfile.TemporaryDirectory(prefix="qdeploy-ort-probe-") as folder:
            path = Path(folder) / "model.onnx"
            path.write_bytes(source.SerializeToString())
            return load_error(path)
    try:
        result = call_isolated(__name__, "load_here", {"path": str(source)}, model_bytes=bytes_on_disk(source))
    except FreshPythonError as exc:
        if exc.signal is None:  # the child failed before or after ONNX Runtime: not checked
            return f"the load check could not run: {exc}"
        return (f"ONNX Runtime crashed loading it with its default session options (the process ended with "
                f"signal {exc.signal}): an ONNX Runtime bug, not a wrong model")
    error = result.get("error")
    return str(error) if error else None


def load_here(payload: dict[str, Any]) -> dict[str, Any]:
    """The child's side: default session options, as a deployment loads the file."""
    import onnxruntime as ort

    ort.set_default_logger_severity(3)
    try:
        ort.InferenceSession(payload["path"], providers=["CPUExecutionProvider"])
    except Exception as exc:  # the parent raises its own error with this message
        return {"error": f"{type(exc).__name__}: {exc}"}
    return {"error": None}
