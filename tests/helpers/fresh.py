"""Functions that tests call in a fresh interpreter (``qdeploy.core.fresh_python``)."""

from __future__ import annotations

import sys
from collections.abc import Callable
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


def segfault_on_name(payload: dict[str, Any]) -> dict[str, Any]:
    """A load or compile check (``ort_probe``, ``openvino_probe``) that crashes on files whose path holds
    ``payload["crash_on"]`` and checks any other as it does."""
    from qdeploy.targets.openvino_probe import compile_here
    from qdeploy.targets.ort_probe import load_here

    if payload.pop("crash_on") in payload["path"]:
        segfault(payload)
    return (compile_here if payload.pop("runtime") == "openvino" else load_here)(payload)


def crashing_on(part: str, runtime: str) -> Callable[..., dict[str, Any]]:
    """``call_isolated`` for the ``runtime`` probe ("onnxruntime", "openvino") whose child crashes on files whose
    path holds ``part``."""
    from qdeploy.core.child_worker import call_in_worker

    def call(module: str, function: str, payload: dict[str, Any], **_: Any) -> dict[str, Any]:
        return call_in_worker(__name__, "segfault_on_name", {**payload, "crash_on": part, "runtime": runtime})

    return call
