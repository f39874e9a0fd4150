"""Functions that tests call in a fresh interpreter (``qdeploy.core.fresh_python``)."""

from __future__ import annotations

import sys
from typing import Any


def echo(payload: dict[str, Any]) -> dict[str, Any]:
    return {"got": payload, "numpy_loaded": "numpy" in sys.modules}


def crash(payload: dict[str, Any]) -> dict[str, Any]:
    raise ValueError(f"asked to fail: {payload['why']}")


def segfault(payload: dict[str, Any]) -> dict[str, Any]:
    """A real segmentation fault, as ONNX Runtime's optimisers end a process on some graphs."""
    import ctypes

    ctypes.string_at(0)
    return payload


def crashing_loads(module: str, function: str, payload: dict[str, Any]) -> dict[str, Any]:
    """``call_in_fresh_python`` whose child segfaults whatever it was asked: put in place of ``ort_probe``'s."""
    from qdeploy.core.fresh_python import call_in_fresh_python

    return call_in_fresh_python(__name__, "segfault", payload)
