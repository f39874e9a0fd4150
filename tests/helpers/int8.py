"""What the CPU running the tests computes in int8, so accuracy bounds can say which path they hold for.

x86 CPUs without VNNI saturate full-range int8 products (``qdeploy``'s ``pipeline/int8_path.py``): a bound that
depends on it asserts the bound of the path this CPU takes, and the exact arithmetic of the graph is checked
everywhere by running it without ONNX Runtime's int8 fusions.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

from qdeploy.targets.int8_path import Int8Path, int8_path

__all__ = ["Int8Path", "exact_int8", "run_ort_unfused", "this_cpu"]


def this_cpu() -> Int8Path:
    return int8_path()


def exact_int8() -> bool:
    """Full-range int8 computes exactly on this CPU (VNNI, arm64)."""
    return int8_path().exact


def run_ort_unfused(model: onnx.ModelProto | Path, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """The graph's exact arithmetic on any CPU: no int8 fusion (DequantizeLinear -> float op -> QuantizeLinear)."""
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    source = str(model) if isinstance(model, Path) else model.SerializeToString()
    return ort.InferenceSession(source, options, providers=["CPUExecutionProvider"]).run(None, feeds)
