"""Nodes left float because a tensor they read or write holds +-Inf or NaN: masks have no int8 form.

chython-rxnmap's transformer adds an attention mask gathered from an embedding table of distances whose first row is
-Inf.  Quantized, the Gather's table took an infinite scale (NaN after its DequantizeLinear: 32,768 NaN in
OpenVINO's output), and a range calibrated on the finite values saturates -Inf to its low end, so masked positions
get weight again (cosine 0.87 on ONNX Runtime).  Calibration counts the non-finite values of each tensor; every node
that reads or writes such a tensor stays float, and so does a node of the quantized op types that reads a constant
holding one (a table whose masked rows no calibration sample gathered).
"""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from qdeploy.stages.quantize.ptq._preprocess import weights_read_on_demand

if TYPE_CHECKING:
    import onnx

__all__ = ["nonfinite_nodes"]

_FLOAT_TYPES = (1, 10, 11, 16)  # float, float16, double, bfloat16


def nonfinite_nodes(model: onnx.ModelProto, tensors: Collection[str], op_types: Collection[str],
                    folder: Path) -> dict[str, str]:
    """Node name -> the non-finite tensor it reads or writes (calibration's ``tensors``), or the constant of the
    quantized ``op_types`` it reads that holds +-Inf or NaN; the weights are read from ``folder`` one at a time."""
    found: dict[str, str] = {}
    marked = set(tensors)
    for node in model.graph.node:
        touched = next((name for name in (*node.output, *node.input) if name in marked), None)
        if touched is not None:
            found[node.name] = touched
    constants = _nonfinite_constants(model, {name for node in model.graph.node if node.op_type in op_types
                                             and node.name not in found for name in node.input}, folder)
    for node in model.graph.node:
        held = next((name for name in node.input if name in constants), None)
        if held is not None and node.op_type in op_types and node.name not in found:
            found[node.name] = held
    return found


def _nonfinite_constants(model: onnx.ModelProto, read: set[str], folder: Path) -> set[str]:
    """The float initializers among ``read`` that hold +-Inf or NaN."""
    from onnx import numpy_helper

    held = set()
    with weights_read_on_demand(folder):
        for init in model.graph.initializer:
            if init.name in read and init.data_type in _FLOAT_TYPES and not np.isfinite(
                    numpy_helper.to_array(init)).all():
                held.add(init.name)
    return held
