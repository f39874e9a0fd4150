"""Light copies of a model: large float initializers travel as short tags and get their bytes back afterwards.

onnxoptimizer (``_optimizer``, ``_optimizer_pieces``) and shape inference (``_shapes``) copy the whole model;
with a light copy they copy kilobytes instead of the weights.

Edits protobuf directly: it swaps tensors, not nodes, in copies made for onnxoptimizer and shape inference,
which take protobuf (``qdeploy.graph.edit`` is the editor for node structure).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import onnx

__all__ = ["STRIP_MIN_BYTES", "Light", "light_copy", "restore", "take_value_info"]

STRIP_MIN_BYTES = 1024
_KEPT_TYPES = frozenset({6, 7, 9, 8, 12, 13})  # int32, int64, bool, string, uint32, uint64: shapes, indices, axes
_TAG = b"\x00qdeploy-stripped:"


@dataclass
class Light:
    """A copy of a model whose large initializers hold tags instead of their bytes."""

    model: onnx.ModelProto
    originals: dict[bytes, onnx.TensorProto] = field(default_factory=dict)
    """tag -> the tensor of the full model it stands for."""
    copied: set[str] = field(default_factory=set)
    """Initializers copied whole (their bytes are never read back)."""


def light_copy(model: onnx.ModelProto, *, value_info: bool = True) -> Light:
    """A copy of ``model`` without the bytes of its large top-level initializers (never read, so never copied).

    ``value_info`` false leaves the top-level value_info out too (shape inference makes it anew).
    """
    import onnx

    from qdeploy.graph.utils import tensor_nbytes

    graph = model.graph
    copy = onnx.ModelProto()
    copy.ir_version = model.ir_version
    copy.opset_import.extend(model.opset_import)
    copy.functions.extend(model.functions)
    target = copy.graph
    target.name = graph.name
    for field_name in ("node", "input", "output", "sparse_initializer", *(("value_info",) if value_info else ())):
        getattr(target, field_name).extend(getattr(graph, field_name))
    light = Light(copy)
    for init in graph.initializer:
        if init.data_type in _KEPT_TYPES or init.data_location != 0 or tensor_nbytes(init) < STRIP_MIN_BYTES:
            target.initializer.append(init)
            light.copied.add(init.name)
            continue
        tag = _TAG + str(len(light.originals)).encode()
        stand_in = target.initializer.add()
        stand_in.name = init.name
        stand_in.data_type = init.data_type
        stand_in.dims.extend(init.dims)
        stand_in.raw_data = tag
        light.originals[tag] = init
    return light


def restore(model: onnx.ModelProto, light: Light) -> list[str]:
    """Put the full tensors back where ``model`` (made from ``light``) holds tags; names of tags left over."""
    if not light.originals:
        return []
    leftover = []
    for init in model.graph.initializer:
        if init.name in light.copied or init.data_type in _KEPT_TYPES or not init.HasField("raw_data"):
            continue
        raw = init.raw_data  # a tag, or a small tensor a pass made: cheap to read
        if not raw.startswith(_TAG):
            continue
        original = light.originals.get(raw)
        if original is None:
            leftover.append(init.name)
            continue
        name, dims = init.name, list(init.dims)
        if math.prod(dims) != math.prod(original.dims):
            leftover.append(init.name)  # a pass reshaped it into another size: not a tensor we know
            continue
        init.CopyFrom(original)
        init.name = name
        if dims != list(original.dims):
            del init.dims[:]
            init.dims.extend(dims)
    return leftover


def take_value_info(graph: onnx.GraphProto, inferred: onnx.GraphProto) -> None:
    """Copy the inferred value_info of a graph and of its subgraphs (same nodes, same order) into ``graph``."""
    from qdeploy.graph.utils import subgraphs

    del graph.value_info[:]
    graph.value_info.extend(inferred.value_info)
    for index, node in enumerate(graph.node):
        inner = subgraphs(node)
        if not inner:
            continue
        twin = inferred.node[index]
        if node.output != twin.output:
            return  # inference does not reorder nodes; if it ever does, keep what is there
        for sub, sub_twin in zip(inner, subgraphs(twin), strict=True):
            take_value_info(sub, sub_twin)
