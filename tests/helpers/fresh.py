"""Functions that tests call in a fresh interpreter (``qdeploy.core.fresh_python``)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any


def echo(payload: dict[str, Any]) -> dict[str, Any]:
    return {"got": payload, "numpy_loaded": "numpy" in sys.modules}


def crash(payload: dict[str, Any]) -> dict[str, Any]:
    raise ValueError(f"asked to fail: {payload['why']}")


def pid(payload: dict[str, Any]) -> dict[str, Any]:
    import os

    return {"pid": os.getpid()}


def noisy(payload: dict[str, Any]) -> dict[str, Any]:
    """Writes on stdout, through Python and through the descriptor, as a runtime's C++ logging does."""
    import os

    print("from print")
    os.write(1, b"from the descriptor\n")
    return {"quiet": True}


def segfault(payload: dict[str, Any]) -> dict[str, Any]:
    """A real segmentation fault, as ONNX Runtime's optimisers end a process on some graphs."""
    import ctypes

    ctypes.string_at(0)
    return payload


def crashing_loads(module: str, function: str, payload: dict[str, Any], **_: Any) -> dict[str, Any]:
    """``call_isolated`` whose child segfaults whatever it was asked: put in place of ``ort_probe``'s."""
    from qdeploy.core.child_worker import call_in_worker

    return call_in_worker(__name__, "segfault", payload)


def segfault_on_candidates(payload: dict[str, Any]) -> dict[str, Any]:
    """OpenVINO's check of a file whose name starts with "candidate" crashes; of any other, runs as it does."""
    from qdeploy.targets.openvino_probe import compile_here

    if Path(payload["path"]).name.startswith("candidate"):
        segfault(payload)
    return compile_here(payload)


def crashing_on_candidates(module: str, function: str, payload: dict[str, Any], **_: Any) -> dict[str, Any]:
    """``call_isolated`` for ``openvino_probe`` whose child crashes on files named "candidate*"."""
    from qdeploy.core.child_worker import call_in_worker

    return call_in_worker(__name__, "segfault_on_candidates", payload)
