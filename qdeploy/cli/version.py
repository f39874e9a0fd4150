"""`qdeploy --version`: qdeploy's version and the runtimes it would run with, read without importing them."""

from __future__ import annotations

import platform
from importlib import metadata

__all__ = ["SHOWN", "version_text"]

SHOWN = ("onnx", "onnxruntime", "openvino", "numpy")


def _version(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "not installed"


def version_text() -> str:
    """'qdeploy 0.1.0' then one line with python and each runtime's version (metadata only: fast)."""
    runtimes = ", ".join(f"{name} {_version(name)}" for name in SHOWN)
    return f"qdeploy {_version('qdeploy')}\npython {platform.python_version()}, {runtimes}"
