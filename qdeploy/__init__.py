"""qdeploy: quantization and precision deployment of ONNX models, one recipe and one report.

The public API (``qdeploy.api``), imported on first use so that ``import qdeploy`` stays cheap:

    import qdeploy
    result = qdeploy.run("recipe.yaml")       # RunResult: report, artifacts, exit_code
    qdeploy.compare("runs/a", "runs/b")

Installed, everything lives under this one package: ``qdeploy.core``, ``qdeploy.graph``, ``qdeploy.targets``,
``qdeploy.calibration``, ``qdeploy.stages``, ``qdeploy.pipeline`` (docs/design.md draws the layers).
"""

from __future__ import annotations

from importlib import import_module, metadata
from typing import Any

__all__ = ["ArtifactInfo", "BenchmarkRow", "BuildFailure", "GateResult", "Recipe", "RunResult", "ThroughputRow",
           "UnmeasuredEntry", "ValidationRow", "__version__", "compare", "explain", "load_recipe", "open_run", "run",
           "sweep"]

try:
    __version__ = metadata.version("qdeploy")
except metadata.PackageNotFoundError:  # a checkout that was never installed
    __version__ = "0+unknown"

_API = {"ArtifactInfo", "BenchmarkRow", "BuildFailure", "GateResult", "Recipe", "RunResult", "ThroughputRow",
        "UnmeasuredEntry", "ValidationRow", "compare", "explain", "load_recipe", "open_run", "run", "sweep"}


def __getattr__(name: str) -> Any:
    if name in _API:
        return getattr(import_module("qdeploy.api"), name)
    raise AttributeError(f"module 'qdeploy' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
