"""A model loaded in ONNX Runtime in a child process first, where loading it might crash the process.

Some graphs crash ONNX Runtime's CPU provider while it optimizes them at session creation, not with an error but
with a segmentation fault: a float16 MatMul fed by a Transpose of its batch axes, at ORT_ENABLE_ALL, in ONNX
Runtime 1.32 (its MatMul-Transpose fusion makes a float16 FusedMatMul that the NCHWc transformer then trips on;
microsoft/onnxruntime#15494 is a float16 ResNet that did the same).  In the run's own process that ends the run
with no report; loaded here first, in a child process (``qdeploy.core.child_worker``: one kept for small
models), it fails one variant with the reason.

Given one sample, the child also runs it: some kernels refuse only at run time.  ONNX Runtime 1.32's CPU provider
loads a float16 ``ScatterElements`` with ``reduction: add`` and then fails every run ("MLFloat16 data type is not
supported with ScatterElements opset 16 when reduction is 'add'"): minimol's fp16 artifact passed the load check
and failed validation.
"""

from __future__ import annotations

import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from qdeploy.core.child_worker import call_isolated
from qdeploy.core.files import bytes_on_disk
from qdeploy.core.fresh_python import FreshPythonError

if TYPE_CHECKING:
    import onnx

__all__ = ["load_error"]


def load_error(source: Path | onnx.ModelProto, feed: Mapping[str, np.ndarray] | None = None) -> str | None:
    """None when ONNX Runtime's CPU provider loads the model (a file, or one in memory, written to a temporary file
    for the child) with its default session options and, given ``feed`` (one sample: input name -> array, floats
    cast to the types the model declares), runs it; else why not: its exception, or the crash that ended the child
    process."""
    if isinstance(source, Path) and feed is None:
        return _probe(source, None)
    with tempfile.TemporaryDirectory(prefix="qdeploy-ort-probe-") as folder:
        if not isinstance(source, Path):
            path = Path(folder) / "model.onnx"
            path.write_bytes(source.SerializeToString())
            source = path
        sample = None
        if feed is not None:
            sample = Path(folder) / "feed.npz"
            np.savez(sample, **feed)
        return _probe(source, sample)


def _probe(path: Path, sample: Path | None) -> str | None:
    payload = {"path": str(path), "feed": str(sample) if sample else None}
    try:
        result = call_isolated(__name__, "load_here", payload, model_bytes=bytes_on_disk(path))
    except FreshPythonError as exc:
        if exc.signal is None:  # the child failed before or after ONNX Runtime: not checked
            return f"the load check could not run: {exc}"
        doing = "running a sample" if sample else "loading it"
        return (f"ONNX Runtime crashed {doing} with its default session options (the process ended with "
                f"signal {exc.signal}): an ONNX Runtime bug, not a wrong model")
    error = result.get("error")
    return str(error) if error else None


def load_here(payload: dict[str, Any]) -> dict[str, Any]:
    """The child's side: default session options, as a deployment loads the file."""
    import onnxruntime as ort

    ort.set_default_logger_severity(4)
    try:
        session = ort.InferenceSession(payload["path"], providers=["CPUExecutionProvider"])
    except Exception as exc:  # the parent raises its own error with this message
        return {"error": f"{type(exc).__name__}: {exc}"}
    if not payload.get("feed"):
        return {"error": None}
    with np.load(payload["feed"]) as stored:
        feed = {item.name: _typed(stored[item.name], item.type) for item in session.get_inputs()
                if item.name in stored.files}
    try:
        session.run(None, feed)
    except Exception as exc:
        return {"error": f"{type(exc).__name__} running one sample: {exc}"}
    return {"error": None}


_FLOATS = {"tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(double)": np.float64}


def _typed(array: np.ndarray, declared: str) -> np.ndarray:
    """A float sample in the float type the input declares (a float16 model without keep_io_types)."""
    wanted = _FLOATS.get(declared)
    return array.astype(wanted) if wanted is not None and array.dtype.kind == "f" else array
