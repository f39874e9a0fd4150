"""Tensors whose values follow from the shapes of the graph's inputs, not from their values.

An exporter that keeps height and width symbolic computes at run time what a static export would have written as
constants: YOLOv8's anchor grid and strides (``Shape -> Gather -> Cast -> Range -> ... -> Expand``), a position
table sliced to the sequence length, an attention mask from ``Range``.  These values are exact (grid points,
strides, indices); a quantizer that calibrates them like activations rounds a grid of 0.5 .. 39.5 to 256 levels
and every box moves with it.  NNCF leaves such "ShapeOf subgraphs" out of quantization; ``shape_computed`` finds
them for qdeploy's quantizer.

A tensor is *data* when it depends on the value of a graph input, *shape-computed* when it depends on the
graph's inputs only through ``Shape`` or ``Size``, and *constant* when it depends on neither.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from qdeploy.graph.utils import has_subgraph, subgraphs, tensor_types

if TYPE_CHECKING:
    import onnx

__all__ = ["shape_computed", "shape_computed_nodes"]

_SHAPE_READERS = frozenset({"Shape", "Size"})
_DATA, _SHAPE = "data", "shape"


def shape_computed(graph: onnx.GraphProto) -> set[str]:
    """Names of the tensors of ``graph`` (topologically sorted, as ONNX requires) computed from its inputs'
    shapes alone."""
    initializers = {tensor.name for tensor in graph.initializer}
    kind = {value.name: _DATA for value in graph.input if value.name not in initializers}
    for node in graph.node:
        kinds = {kind.get(name) for name in node.input if name}
        if has_subgraph(node):
            # a body may read data from the outer scope: data unless nothing it reads is
            kinds |= {kind.get(name) for body in subgraphs(node) for name in _outer_reads(body)}
            produced = _DATA if kinds - {None} else None
        elif node.op_type in _SHAPE_READERS and node.domain in ("", "ai.onnx"):
            produced = _SHAPE if kinds - {None} else None
        elif _DATA in kinds:
            produced = _DATA
        else:
            produced = _SHAPE if _SHAPE in kinds else None
        for name in node.output:
            if name and produced:
                kind[name] = produced
    return {name for name, value in kind.items() if value == _SHAPE}


def shape_computed_nodes(model: onnx.ModelProto) -> list[str]:
    """Nodes a quantizer must leave float: those that write or read a float tensor computed from the inputs'
    shapes alone (``shape_computed``).  Tensors of unknown type count as float."""
    from onnx import TensorProto

    float_types = {TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16, TensorProto.DOUBLE}
    graph = model.graph
    types = tensor_types(graph)
    floats = {name for name in shape_computed(graph) if types.get(name, TensorProto.FLOAT) in float_types}
    return sorted({node.name for node in graph.node if node.name
                   and any(name in floats for name in (*node.input, *node.output))})


def _outer_reads(body: onnx.GraphProto) -> set[str]:
    """Names a subgraph reads that it does not define (from the enclosing scopes)."""
    defined = {value.name for value in body.input} | {tensor.name for tensor in body.initializer}
    read: set[str] = set()
    for node in body.node:
        read |= {name for name in node.input if name and name not in defined}
        for inner in subgraphs(node):
            read |= _outer_reads(inner) - defined
        defined |= set(node.output)
    return read
