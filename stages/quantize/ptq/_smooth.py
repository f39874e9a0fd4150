"""Activation smoothing before ptq (SmoothQuant, Xiao et al. 2023): move activation outliers into the weights.

Transformers carry a few activation channels hundreds of times larger than the rest (LayerNorm gains), so one
per-tensor int8 scale for the activation rounds every other channel to a handful of levels.  For a MatMul or
Gemm ``y = x W`` with a constant ``W``, ``y = (x / s) (diag(s) W)`` for any positive per-channel ``s``; with
``s_j = max|x_j|^alpha / max|W_j|^(1 - alpha)`` the activation's channels even out and the weight, quantized
per output channel, absorbs the difference.  The division is a Mul by ``1/s`` inserted before the MatMul (one
per activation tensor, shared by every MatMul/Gemm reading it, which must then share ``s``); runtimes fold it
into the quantization of that input.  The float model stays the same function, up to float rounding.

Edits protobuf directly: a weight pass, one tensor at a time (no second copy of the weights); it adds one Mul
per activation and changes no other node.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from qdeploy.calibration.activations import FeedSource, channel_absmax
from qdeploy.core.onnx_wire import load_model
from qdeploy.graph.external_data import save_onnx
from qdeploy.graph.names import unique_node_name
from qdeploy.graph.utils import delete_where, names_read, node_attributes
from qdeploy.stages.quantize.findings import SmoothedTensor, SmoothQuantRecord

if TYPE_CHECKING:
    import onnx

_MIN_SCALE = 1e-5


@dataclass
class _Reader:
    """A MatMul or Gemm reading an activation through a constant 2-D weight, and the weight's input axis."""

    node: onnx.NodeProto
    weight: str
    in_axis: int  # the weight axis that meets the activation's channels


@dataclass
class AlphaMeasurement:
    """What smoothing reads of a model once, whatever alpha: its MatMul/Gemm readers per activation tensor and
    each tensor's per-channel largest |value| on the calibration data (the int8 ranges after smoothing do depend
    on alpha and are calibrated per alpha)."""

    path: Path
    op_types: list[str]
    excluded: set[str]
    readers: dict[str, list[_Reader]]
    peaks: dict[str, np.ndarray]
    samples: int


def measure(prepared: Path, feeds: FeedSource, op_types: list[str], excluded: set[str],
            work_dir: Path) -> AlphaMeasurement:
    """The readers and activation maxima of ``prepared``: one pass over the calibration data."""
    readers = _readers(load_model(prepared, load_external_data=False), op_types, excluded)
    if not readers:
        return AlphaMeasurement(prepared, op_types, excluded, {}, {}, 0)
    peaks, samples = channel_absmax(prepared, list(readers), feeds, work_dir)
    return AlphaMeasurement(prepared, op_types, excluded, readers, peaks, samples)


def smooth(prepared: Path, feeds: FeedSource, alpha: float, op_types: list[str], excluded: set[str],
           work_dir: Path) -> tuple[Path, SmoothQuantRecord]:
    """The prepared model with its MatMul/Gemm activations smoothed, saved beside it, and what was done."""
    return smoothed_with(measure(prepared, feeds, op_types, excluded, work_dir), alpha, work_dir / "smoothed.onnx")


def smoothed_with(measured: AlphaMeasurement, alpha: float, path: Path) -> tuple[Path, SmoothQuantRecord]:
    """The measured model smoothed with ``alpha``, saved at ``path`` (the model itself when nothing is smoothed),
    and what was done."""
    if not measured.readers:
        return measured.path, SmoothQuantRecord(
            alpha=alpha, smoothed_tensors=0, note="no MatMul/Gemm with a constant 2-D weight reads a float activation")
    from onnx import numpy_helper

    model = load_model(measured.path)
    readers = _readers(model, measured.op_types, measured.excluded)  # this copy's nodes: each alpha edits its own
    tensors = {init.name: init for init in model.graph.initializer}
    smoothed: dict[str, SmoothedTensor] = {}
    for tensor, group in readers.items():
        weights = {r.weight: numpy_helper.to_array(tensors[r.weight]).astype(np.float32) for r in group}
        peaks_of = [np.abs(weights[r.weight]).max(axis=1 - r.in_axis) for r in group]
        scale = _scale(measured.peaks.get(tensor), peaks_of, alpha)
        if scale is None:
            continue
        _apply(model, tensor, group, scale, weights)
        smoothed[tensor] = SmoothedTensor(nodes=[r.node.name for r in group], max_scale=float(scale.max()),
                                          min_scale=float(scale.min()))
    _drop_unread(model, {reader.weight for group in readers.values() for reader in group})
    save_onnx(model, path)
    return path, SmoothQuantRecord(alpha=alpha, samples=measured.samples, smoothed_tensors=len(smoothed),
                                   tensors=smoothed)


def _readers(model: onnx.ModelProto, op_types: list[str], excluded: set[str]) -> dict[str, list[_Reader]]:
    """Activation tensor -> the quantized MatMul/Gemm nodes that read it through a constant 2-D float weight.  Its
    other readers (a residual Add, an excluded or activation-by-activation MatMul) keep reading it unscaled."""
    from onnx import TensorProto

    weights = {init.name for init in model.graph.initializer
               if len(init.dims) == 2 and init.data_type == TensorProto.FLOAT}
    found: dict[str, list[_Reader]] = defaultdict(list)
    for node in model.graph.node:
        if node.op_type not in ("MatMul", "Gemm") or node.op_type not in op_types or node.name in excluded:
            continue
        if len(node.input) < 2 or node.input[1] not in weights or node.input[0] in weights:
            continue
        attrs = node_attributes(node)
        if not attrs.get("transA", 0):
            found[node.input[0]].append(_Reader(node, node.input[1], 1 if attrs.get("transB", 0) else 0))
    return dict(found)


def _scale(activation: np.ndarray | None, weights: list[np.ndarray], alpha: float) -> np.ndarray | None:
    """``s_j = max|x_j|^alpha / max|W_j|^(1-alpha)`` over the group's weights; None when unusable."""
    if activation is None or any(w.shape != activation.shape for w in weights):
        return None
    weight = np.maximum.reduce(weights)
    with np.errstate(divide="ignore", invalid="ignore"):
        scale = np.power(activation, alpha) / np.power(weight, 1.0 - alpha)
    scale = np.where(np.isfinite(scale) & (scale > _MIN_SCALE) & (activation > 0) & (weight > 0), scale, 1.0)
    return scale.astype(np.float32)


def _apply(model: onnx.ModelProto, tensor: str, group: list[_Reader], scale: np.ndarray,
           weights: dict[str, np.ndarray]) -> None:
    """Insert ``x / s`` once, read by every node of the group, and scale each weight's input axis by ``s``."""
    import onnx
    from onnx import helper, numpy_helper

    base = tensor.replace("/", "_").strip("_") or "x"
    inverse, divided = f"{base}_smooth_inv", f"{base}_smoothed"
    model.graph.initializer.append(numpy_helper.from_array((1.0 / scale).astype(np.float32), inverse))
    readers = {reader.node.name for reader in group}  # prepare() named every node uniquely
    position = next(index for index, node in enumerate(model.graph.node) if node.name in readers)
    model.graph.node.insert(position, helper.make_node("Mul", [tensor, inverse], [divided],
                                                       name=unique_node_name(model.graph, f"{base}_smooth")))
    typed = next((value for value in (*model.graph.value_info, *model.graph.input, *model.graph.output)
                  if value.name == tensor), None)
    if typed is not None:  # calibration picks tensors by their declared float type
        model.graph.value_info.append(onnx.ValueInfoProto(name=divided, type=typed.type))
    for reader in group:
        shape = (-1, 1) if reader.in_axis == 0 else (1, -1)
        name = f"{reader.node.name or reader.weight}_smoothed_weight".replace("/", "_").strip("_")
        model.graph.initializer.append(numpy_helper.from_array(weights[reader.weight] * scale.reshape(shape), name))
        reader.node.input[0], reader.node.input[1] = divided, name


def _drop_unread(model: onnx.ModelProto, names: set[str]) -> None:
    """Remove the initializers among ``names`` that nothing reads any more (the unsmoothed weights)."""
    read = names_read(list(model.graph.node), model.graph)
    delete_where(model.graph.initializer, lambda init: init.name in names and init.name not in read)
