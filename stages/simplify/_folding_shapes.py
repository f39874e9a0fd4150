"""What constant folding knows from shapes: static shapes, partly symbolic ones, and the values they give.

``Shape``/``Size`` of a statically shaped tensor fold without evaluation; so
do static dimensions picked out of a partly symbolic shape (``Shape`` then
``Gather``/``Slice`` of constant indices), which is how exporters compute
reshape targets for a dynamic batch.  Shapes are read from value_info lazily.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from qdeploy.graph.utils import _ELEMENT_BYTES

if TYPE_CHECKING:
    import numpy as np
    import onnx



ShapeEntry = tuple[int | None, ...] | tuple[tuple[int, ...], int]
"""What ``LazyShapes`` holds per name: the dimensions (None where symbolic) when partial, else (static dims,
element type)."""


class LazyShapes(Mapping[str, Any]):
    """Shapes read from value_info only when asked (a graph of 50,000 nodes asks for few of them).

    ``partial``: dimensions of every value of known rank, None where symbolic; otherwise (dims, element type)
    of values whose shape is fully static.  ``fixed`` entries (constant initializers) come first.
    """

    def __init__(self, values: dict[str, onnx.ValueInfoProto], fixed: dict[str, ShapeEntry] | None = None, *,
                 partial: bool) -> None:
        self._values = values
        self._cache: dict[str, ShapeEntry] = dict(fixed or {})
        self._partial = partial

    def __getitem__(self, name: str) -> Any:
        if name in self._cache:
            return self._cache[name]
        found = self._read(name)
        if found is None:
            raise KeyError(name)
        self._cache[name] = found
        return found

    def _read(self, name: str) -> Any:
        value = self._values.get(name)
        if value is None or not value.type.HasField("tensor_type") or not value.type.tensor_type.HasField("shape"):
            return None
        tensor_type = value.type.tensor_type
        dims = tuple(dim.dim_value if dim.HasField("dim_value") else None for dim in tensor_type.shape.dim)
        if self._partial:
            return dims
        return None if None in dims else (dims, tensor_type.elem_type)

    def __contains__(self, name: object) -> bool:
        try:
            self[name]  # type: ignore[index]
        except KeyError:
            return False
        return True

    def __iter__(self) -> Iterator[str]:
        return iter(name for name in {**self._values, **self._cache} if name in self)

    def __len__(self) -> int:
        return sum(1 for _ in self)



@dataclass
class Scope:
    """A graph being folded and what it can see: its constants and those of the graphs around it."""

    graph: onnx.GraphProto
    tensors: dict[str, onnx.TensorProto]
    """Constant tensors visible here by name (outer scopes' and this graph's non-overridable initializers)."""
    shapes: Mapping[str, tuple[tuple[int, ...], int]]
    protected: set[str] = field(default_factory=set)
    """Names that must stay computed by a node (a subgraph's outputs)."""
    partial: Mapping[str, tuple[int | None, ...]] = field(default_factory=dict)
    """Dimensions of tensors whose rank is known (None: a symbolic dimension)."""
    constant_nodes: bool = False
    """Folded values become Constant nodes (subgraphs: tools lose subgraph initializers) instead of initializers."""


def value_infos(graph: onnx.GraphProto) -> dict[str, onnx.ValueInfoProto]:
    """Every declared or inferred value of a graph by name (inputs, value_info, outputs)."""
    return {value.name: value for value in (*graph.input, *graph.value_info, *graph.output)}


def static_shapes(graph: onnx.GraphProto, constant: set[str], values: dict[str, onnx.ValueInfoProto] | None = None,
                  *, extra: dict[str, onnx.TensorProto] | None = None) -> LazyShapes:
    """Names of ``graph`` whose shape is fully known, from inputs, value_info, outputs, constant initializers and
    the ``extra`` constant tensors (a subgraph's Constant nodes)."""
    # An overridable initializer has the shape its graph input declares, not necessarily its default's.
    fixed = {init.name: (tuple(init.dims), init.data_type) for init in graph.initializer if init.name in constant}
    fixed.update((name, (tuple(tensor.dims), tensor.data_type)) for name, tensor in (extra or {}).items())
    return LazyShapes(values if values is not None else value_infos(graph), fixed, partial=False)


def estimated_bytes(name: str, shapes: Mapping[str, tuple[tuple[int, ...], int]]) -> int | None:
    """Bytes of a tensor from its static shape; None when the shape or element size is unknown."""
    if name not in shapes:
        return None
    dims, elem_type = shapes[name]
    size = _ELEMENT_BYTES.get(elem_type)
    if size is None:
        return None
    for dim in dims:
        size *= dim
    return size


def shape_value(node: onnx.NodeProto, shapes: Mapping[str, tuple[tuple[int, ...], int]]) -> np.ndarray | None:
    """The value of a Shape or Size node whose input shape is static; None otherwise."""
    import numpy as np

    if node.op_type not in ("Shape", "Size") or not node.input or node.input[0] not in shapes:
        return None
    dims = shapes[node.input[0]][0]
    if node.op_type == "Size":
        return np.array(int(np.prod(dims, dtype=np.int64)), dtype=np.int64)
    attrs = {attr.name: attr.i for attr in node.attribute}
    rank = len(dims)
    start, end = attrs.get("start", 0), attrs.get("end", rank)
    start, end = (min(max(v + rank if v < 0 else v, 0), rank) for v in (start, end))
    return np.array(dims[start:end], dtype=np.int64)


def partial_shapes(graph: onnx.GraphProto, values: dict[str, onnx.ValueInfoProto] | None = None) -> LazyShapes:
    """Dimensions of every value of known rank (None where symbolic or unknown)."""
    return LazyShapes(values if values is not None else value_infos(graph), partial=True)


def partial_shape_value(node: onnx.NodeProto, scope: Scope, vectors: dict[str, list[int | None]],
                        known: dict[str, np.ndarray]) -> np.ndarray | None:
    """Static dimensions picked out of a partly symbolic shape: Shape, then Gather or Slice of constant indices.

    Records the dimensions of a Shape output in ``vectors`` for the Gather/Slice after it; returns a value
    when the node's result is all static dimensions.
    """
    import numpy as np

    if node.op_type == "Shape" and node.input and node.input[0] in scope.partial:
        dims = list(scope.partial[node.input[0]])
        attrs = {attr.name: attr.i for attr in node.attribute}
        rank = len(dims)
        start, end = (min(max(v + rank if v < 0 else v, 0), rank) for v in (attrs.get("start", 0),
                                                                              attrs.get("end", rank)))
        vectors[node.output[0]] = dims[start:end]
        return None
    if node.op_type not in ("Gather", "Slice") or not node.input or node.input[0] not in vectors:
        return None
    args = [_constant_value(name, scope, known) for name in node.input[1:]]
    if any(arg is None for arg in args):
        return None
    dims = vectors[node.input[0]]
    positions = np.arange(len(dims))
    try:
        if node.op_type == "Gather":
            picked = positions[np.asarray(args[0], dtype=np.int64)]
        else:
            starts, ends = (np.asarray(arg, dtype=np.int64).reshape(-1) for arg in args[:2])
            if len(args) > 2 and [int(axis) for axis in np.asarray(args[2]).reshape(-1)] not in ([0], [-1]):
                return None
            if len(args) > 3 and [int(step) for step in np.asarray(args[3]).reshape(-1)] != [1]:
                return None  # ONNX clamps negative steps differently from Python
            picked = positions[int(starts[0]):int(min(ends[0], 2**62))]
    except (IndexError, ValueError):
        return None
    values = [dims[int(index)] for index in np.asarray(picked).reshape(-1)]
    if any(value is None for value in values):
        return None
    return np.asarray(values, dtype=np.int64).reshape(np.asarray(picked).shape)


def _constant_value(name: str, scope: Scope, known: dict[str, np.ndarray]) -> np.ndarray | None:
    from onnx import numpy_helper

    if name in known:
        return known[name]
    tensor = scope.tensors.get(name)
    return None if tensor is None else numpy_helper.to_array(tensor)
