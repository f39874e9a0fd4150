"""Light copies of a model: large float initializers travel as short tags and get their bytes back afterwards.

onnxoptimizer (``_optimizer``, ``_optimizer_pieces``) and shape inference (``_shapes``) copy the whole model;
with a light copy they copy kilobytes instead of the weights.  ``restore`` puts the bytes back into the copy
(a second copy of each weight); ``restore_into`` does the opposite: the original model takes the copy's graph
and keeps its own tensor messages, so no weight is copied (the simplify loop holds one model, not two).

Edits protobuf directly: it swaps tensors, not nodes, in copies made for onnxoptimizer and shape inference,
which take protobuf (``qdeploy.graph.edit`` is the editor for node structure).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from qdeploy.graph.utils import delete_where, model_bytes, subgraphs, tensor_nbytes

if TYPE_CHECKING:
    import onnx

__all__ = ["MODEL_INFO_FIELDS", "STRIP_MIN_BYTES", "Light", "graph_ranks", "inferred_model", "light_bytes",
           "light_copy", "put_back", "restore", "restore_into", "tag_of", "take_value_info", "tensor_ranks",
           "unknown_tags"]

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


MODEL_INFO_FIELDS = ("producer_name", "producer_version", "domain", "model_version", "doc_string")
"""A model's own fields besides its graph and opsets: who made it, and what its users read from it."""


def light_copy(model: onnx.ModelProto, *, value_info: bool = True, min_bytes: int | None = None) -> Light:
    """A copy of ``model`` without the bytes of its top-level initializers from ``min_bytes`` (``STRIP_MIN_BYTES``
    by default; never read, so never copied).  The model's own fields come with it (``MODEL_INFO_FIELDS``,
    metadata_props, the graph's doc_string): a model built from the copy is an artifact that deployments read them
    from (the fp16 stage's had lost atspm-detector's 8 metadata entries).

    ``value_info`` false leaves the top-level value_info out too (shape inference makes it anew).
    """
    import onnx


    threshold = STRIP_MIN_BYTES if min_bytes is None else min_bytes
    graph = model.graph
    copy = onnx.ModelProto()
    copy.ir_version = model.ir_version
    for field_name in MODEL_INFO_FIELDS:
        setattr(copy, field_name, getattr(model, field_name))
    copy.metadata_props.extend(model.metadata_props)
    copy.opset_import.extend(model.opset_import)
    copy.functions.extend(model.functions)
    target = copy.graph
    target.name = graph.name
    target.doc_string = graph.doc_string
    for field_name in ("node", "input", "output", "sparse_initializer", *(("value_info",) if value_info else ())):
        getattr(target, field_name).extend(getattr(graph, field_name))
    light = Light(copy)
    for init in graph.initializer:
        if init.data_type in _KEPT_TYPES or init.data_location != 0 or tensor_nbytes(init) < threshold:
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


def inferred_model(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` as ONNX's shape inference types it, inferred on a light copy (inference copies the model it reads,
    and types and shapes need no weight bytes); the model itself where inference cannot follow it."""
    import onnx

    try:
        return onnx.shape_inference.infer_shapes(light_copy(model).model)
    except Exception:  # a model inference cannot follow: its own declarations still count
        return model


def tensor_ranks(model: onnx.ModelProto) -> dict[str, int]:
    """Tensor name -> rank, where the model declares it or ONNX's shape inference finds it (nested graphs too);
    the model's own declarations alone where inference fails.  Inferred on a light copy: ranks need no weights."""
    return graph_ranks(inferred_model(model).graph)


def graph_ranks(graph: onnx.GraphProto) -> dict[str, int]:
    """Tensor name -> rank, as ``graph`` (nested graphs too) declares it."""
    ranks: dict[str, int] = {}
    _collect_ranks(graph, ranks)
    return ranks


def _collect_ranks(graph: onnx.GraphProto, ranks: dict[str, int]) -> None:
    for value in (*graph.input, *graph.output, *graph.value_info):
        tensor = value.type.tensor_type
        if value.type.HasField("tensor_type") and tensor.HasField("shape"):
            ranks[value.name] = len(tensor.shape.dim)
    ranks.update((init.name, len(init.dims)) for init in graph.initializer)
    for node in graph.node:
        for sub in subgraphs(node):
            _collect_ranks(sub, ranks)
        if node.op_type == "Constant":
            for attribute in node.attribute:
                if attribute.name == "value" and attribute.HasField("t"):
                    ranks[node.output[0]] = len(attribute.t.dims)


def restore(model: onnx.ModelProto, light: Light) -> list[str]:
    """Put the full tensors back where ``model`` (made from ``light``) holds tags; names of tags left over."""
    if not light.originals:
        return []
    leftover = []
    for init in model.graph.initializer:
        if init.name in light.copied:
            continue
        tag, original = _original_of(init, light)
        if tag is None:
            continue  # a real tensor (a small one a pass made)
        if original is None:
            leftover.append(init.name)
            continue
        put_back(init, original)
    return leftover


def put_back(target: onnx.TensorProto, original: onnx.TensorProto) -> None:
    """``original``'s type and values in ``target``, which keeps its name and its dims (a pass may reshape)."""
    name, dims = target.name, list(target.dims)
    target.CopyFrom(original)
    target.name = name
    if dims != list(original.dims):
        del target.dims[:]
        target.dims.extend(dims)


def _original_of(init: onnx.TensorProto, light: Light) -> tuple[bytes | None, onnx.TensorProto | None]:
    """(the tag ``init`` holds or None, the tensor it stands for or None when the tag is unknown or a pass
    reshaped it into another size)."""
    tag = tag_of(init)
    original = None if tag is None else light.originals.get(tag)
    if original is not None and math.prod(init.dims) != math.prod(original.dims):
        original = None
    return tag, original


def light_bytes(light: Light) -> int:
    """The light copy's serialised size (``model_bytes`` counts a tag at the size of the tensor it stands for)."""
    stripped = sum(tensor_nbytes(tensor) for tensor in light.originals.values())
    return model_bytes(light.model) - stripped + len(light.originals) * (len(_TAG) + 8)


def tag_of(init: onnx.TensorProto) -> bytes | None:
    """The tag a light copy's initializer holds in place of its bytes; None for a real tensor."""
    if init.data_type in _KEPT_TYPES or not init.HasField("raw_data"):
        return None
    raw = init.raw_data
    return raw if raw.startswith(_TAG) else None


def unknown_tags(model: onnx.ModelProto, light: Light) -> list[str]:
    """Initializers of ``model`` (made from ``light``) holding a tag that cannot be given its tensor back."""
    unknown = []
    for init in model.graph.initializer:
        tag, original = _original_of(init, light)
        if tag is not None and original is None:
            unknown.append(init.name)
    return unknown


def restore_into(model: onnx.ModelProto, optimized: onnx.ModelProto, light: Light) -> None:
    """Make ``model`` (the one ``light`` was copied from) hold ``optimized``'s graph, keeping its own tensors.

    A tagged tensor back under its own name stays where it is in ``model`` (reshaped when a pass changed its
    dims), as does any initializer that came back unchanged; tensors a pass made or changed are added, copies
    of a tagged tensor under a new name are copied, and what ``optimized`` dropped goes.  Call it only when
    ``unknown_tags(optimized, light)`` is empty.
    """


    graph = model.graph
    current = {init.name: init for init in graph.initializer}
    kept: dict[str, list[int]] = {}
    added: list[onnx.TensorProto] = []
    for init in optimized.graph.initializer:
        tag = tag_of(init)
        original = light.originals[tag] if tag is not None else None
        same = init.name in current and (original.name == init.name if original is not None
                                          else current[init.name] == init)
        if same:  # the model's own message stays
            kept[init.name] = list(init.dims)
        elif original is not None:  # a copy of a tagged tensor under a new name
            put_back(init, original)
            added.append(init)
        else:
            added.append(init)
    delete_where(graph.initializer, lambda init: init.name not in kept)
    for init in graph.initializer:
        if list(init.dims) != kept[init.name]:
            del init.dims[:]
            init.dims.extend(kept[init.name])
    graph.initializer.extend(added)
    for field_name in ("node", "input", "output", "value_info", "sparse_initializer"):
        target = getattr(graph, field_name)
        del target[:]
        target.extend(getattr(optimized.graph, field_name))


def take_value_info(graph: onnx.GraphProto, inferred: onnx.GraphProto) -> None:
    """Copy the inferred value_info of a graph and of its subgraphs (same nodes, same order) into ``graph``."""
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
