"""onnxoptimizer on a large graph, piece by piece.

onnxoptimizer's time grows with the square of the node count (a 4,000-node
chain takes seconds per pass, 16,000 nodes a minute).  A large graph is
therefore cut into runs of consecutive nodes (the node list is in topological
order); each piece becomes a small model whose inputs are the names it reads
from elsewhere and whose outputs are the names read after it (or by a
subgraph, or graph outputs), gets the passes, and takes its place again.
Large weights travel as tags (``qdeploy.stages.simplify._optimizer``).  Names a pass invents are
made unique across pieces.  What this misses: a pattern that straddles two
pieces (a fusion of the last node of one with the first of the next), and
common subexpressions in different pieces; the simplify loop's next round
cuts elsewhere only if the node count changed, so such leftovers are rare and
harmless.

Edits protobuf directly: onnxoptimizer's interface is protobuf.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from qdeploy.graph.light import light_copy, restore
from qdeploy.graph.utils import subgraph_references, subgraphs
from qdeploy.stages.simplify._folding import constant_names

if TYPE_CHECKING:
    import onnx

log = logging.getLogger(__name__)

PIECE_NODES = 400
"""Nodes per piece: onnxoptimizer takes about 10 ms on one this size."""


@dataclass
class _Names:
    """What the whole graph reads and declares, to find each piece's interface."""

    last_reader: dict[str, int] = field(default_factory=dict)
    """name -> index of the last piece that reads it (subgraph references count)."""
    types: dict[str, onnx.ValueInfoProto] = field(default_factory=dict)
    constants: dict[str, onnx.TensorProto] = field(default_factory=dict)
    outputs: set[str] = field(default_factory=set)
    used: set[str] = field(default_factory=set)


def optimize_in_pieces(model: onnx.ModelProto, passes: list[str], piece_nodes: int | None = None) -> onnx.ModelProto:
    """A copy of ``model`` whose top-level graph went through onnxoptimizer in pieces of ``piece_nodes``."""
    import onnx

    piece_nodes = piece_nodes or PIECE_NODES
    nodes = list(model.graph.node)
    pieces = [nodes[start:start + piece_nodes] for start in range(0, len(nodes), piece_nodes)]
    names = _index(model, pieces)
    result_nodes: list[onnx.NodeProto] = []
    new_initializers: list[onnx.TensorProto] = []
    failed = 0
    for index, piece in enumerate(pieces):
        optimized = _optimize_piece(model, piece, index, names, passes)
        if optimized is None:
            failed += 1
            result_nodes.extend(piece)
            continue
        result_nodes.extend(optimized.graph.node)
        new_initializers.extend(init for init in optimized.graph.initializer if init.name not in names.constants)
    if failed:
        log.info("onnxoptimizer failed on %d of %d pieces; those were left as they were", failed, len(pieces))
    result = onnx.ModelProto()
    result.CopyFrom(model)
    del result.graph.node[:]
    result.graph.node.extend(result_nodes)
    result.graph.initializer.extend(new_initializers)
    return result


def _index(model: onnx.ModelProto, pieces: list[list[onnx.NodeProto]]) -> _Names:
    graph = model.graph
    names = _Names()
    for index, piece in enumerate(pieces):
        for node in piece:
            read = set(node.input)
            for sub in subgraphs(node):
                read |= {name for inner in sub.node for name in inner.input} | subgraph_references(sub)
            for name in read:
                names.last_reader[name] = index
            names.used.update(node.output)
            names.used.update(read)
    constant = constant_names(model)
    names.constants = {init.name: init for init in graph.initializer if init.name in constant}
    names.types = {value.name: value for value in (*graph.input, *graph.value_info, *graph.output)}
    names.outputs = {value.name for value in graph.output}
    names.used |= set(names.constants) | set(names.types)
    return names


def _piece_model(model: onnx.ModelProto, piece: list[onnx.NodeProto], index: int,
                 names: _Names) -> onnx.ModelProto:
    """The piece as a model: reads from outside are inputs or initializers, reads after it are outputs."""
    from onnx import helper


    produced = {name for node in piece for name in node.output if name}
    read: list[str] = []
    for node in piece:
        read.extend(node.input)
        for sub in subgraphs(node):
            read.extend(name for inner in sub.node for name in inner.input)
            read.extend(subgraph_references(sub))
    outer = [name for name in dict.fromkeys(read) if name and name not in produced]
    outputs = [name for name in sorted(produced) if names.last_reader.get(name, -1) > index or name in names.outputs]
    inputs = [names.types.get(name) or helper.make_empty_tensor_value_info(name) for name in outer
              if name not in names.constants]
    initializers = [names.constants[name] for name in outer if name in names.constants]
    graph = helper.make_graph(piece, f"piece{index}", inputs,
                              [names.types.get(name) or helper.make_empty_tensor_value_info(name) for name in outputs],
                              initializers, value_info=[names.types[name] for name in produced
                                                        if name in names.types and name not in outputs])
    piece_model = helper.make_model(graph, opset_imports=list(model.opset_import), ir_version=model.ir_version)
    piece_model.functions.extend(model.functions)
    return piece_model


def _optimize_piece(model: onnx.ModelProto, piece: list[onnx.NodeProto], index: int, names: _Names,
                    passes: list[str]) -> onnx.ModelProto | None:
    """The optimized piece, or None (the piece stays as it is) when onnxoptimizer fails on it."""
    import onnxoptimizer


    piece_model = _piece_model(model, piece, index, names)
    before = _all_names(piece_model.graph)
    light = light_copy(piece_model)
    try:
        optimized = onnxoptimizer.optimize(light.model, passes, fixed_point=True)
    except Exception as exc:  # one piece failing keeps that piece as it was
        log.debug("onnxoptimizer failed on piece %d: %s", index, exc)
        return None
    if restore(optimized, light) or [value.name for value in optimized.graph.output] != \
            [value.name for value in piece_model.graph.output]:
        return None
    _unique_new_names(optimized, before, names, index)
    return optimized


def _all_names(graph: onnx.GraphProto) -> set[str]:
    found = {value.name for value in (*graph.input, *graph.output, *graph.value_info)}
    found |= {init.name for init in graph.initializer}
    for node in graph.node:
        found.update(node.input)
        found.update(node.output)
        for sub in subgraphs(node):
            found |= _all_names(sub)
    return found


def _unique_new_names(piece: onnx.ModelProto, before: set[str], names: _Names, index: int) -> None:
    """Rename the names the passes invented in this piece where the graph or an earlier piece uses them."""
    graph = piece.graph
    invented = _all_names(graph) - before - {""}
    renames = {}
    for name in sorted(invented):
        renames[name] = name
        while renames[name] in names.used:
            renames[name] = f"{renames[name]}_p{index}"
        names.used.add(renames[name])
    renames = {old: new for old, new in renames.items() if old != new}
    if not renames:
        return

    def rename(nodes: list[onnx.NodeProto]) -> None:
        for node in nodes:
            for field_name in ("input", "output"):
                values = getattr(node, field_name)
                for position, name in enumerate(values):
                    if name in renames:
                        values[position] = renames[name]
            for sub in subgraphs(node):
                rename(list(sub.node))

    rename(list(graph.node))
    for init in graph.initializer:
        if init.name in renames:
            init.name = renames[init.name]
