"""Graph plumbing of the fp16 stage: scopes, unique names, renames and dead Casts.

Pure protobuf edits, no numerics.  Names are treated as unique across the whole
model (ONNX's SSA rule, subgraphs included), so one map from tensor name to its
producer, owner graph and type serves every scope.  Topological order and value_info pruning are
``qdeploy.graph``'s (``order.sort_topologically``, ``utils.prune_unused_value_info_recursive``).

Why protobuf and not ``qdeploy.graph.edit``: the passes these helpers serve (``_repair``, ``_emulate``) visit
and rewrite nodes all over a model, in every subgraph (the twins rename every float16 output).  An edit session
saves work by writing back only the nodes it changed; when every node changes, it adds reading the whole graph
into onnx-ir and writing every node back, and a changed subgraph goes back only by re-serialising the whole
node that holds it.  On a 50,000-node chain
(``python benchmarks/edit_session.py``, two runs on a loaded 2-core machine) renaming every edge took 0.3 and
1.1 s as a protobuf walk, and 4.2 and 8.9 s to open plus 1.0 and 1.8 s to write back through a session.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from qdeploy.graph.order import outer_references
from qdeploy.graph.utils import delete_where, rename_uses, subgraphs, walk_graphs

if TYPE_CHECKING:
    import onnx


FLOAT, FLOAT16 = 1, 10  # onnx.TensorProto element types


def walk_nodes(graph: onnx.GraphProto) -> Iterator[tuple[onnx.NodeProto, onnx.GraphProto]]:
    """Every node of the graph and of its nested graphs, with the graph that holds it."""
    for inner in walk_graphs(graph):
        for node in inner.node:
            yield node, inner


def node_dependencies(node: onnx.NodeProto) -> list[str]:
    """Tensors a node needs before it runs: explicit inputs plus its subgraphs' outer references."""
    names = [name for name in node.input if name]
    for sub in subgraphs(node):
        names.extend(sorted(outer_references(sub)))
    return names


def use_counts(graph: onnx.GraphProto) -> dict[str, int]:
    """How often each name is used by the graph's nodes (nested references included) and outputs."""
    counts: dict[str, int] = {}
    for node in graph.node:
        for name in node_dependencies(node):
            counts[name] = counts.get(name, 0) + 1
    for value in graph.output:
        counts[value.name] = counts.get(value.name, 0) + 1
    return counts


def remove_dead_casts(graph: onnx.GraphProto) -> int:
    """Remove Cast nodes whose output nobody uses (in this graph or nested ones); returns how many."""
    counts = use_counts(graph)
    casts = {node.output[0]: node for node in graph.node if node.op_type == "Cast"}
    dead_names = [name for name in casts if not counts.get(name)]
    dead: set[str] = set()
    while dead_names:  # removing a Cast may leave the Cast feeding it unused too
        name = dead_names.pop()
        if name in dead:
            continue
        dead.add(name)
        source = casts[name].input[0]
        counts[source] = counts.get(source, 0) - 1
        if source in casts and counts[source] <= 0:
            dead_names.append(source)
    if dead:
        delete_where(graph.node, lambda node: node.op_type == "Cast" and node.output[0] in dead)
    removed = len(dead)
    for node in graph.node:
        for sub in subgraphs(node):
            removed += remove_dead_casts(sub)
    return removed


def rename_tensor(graph: onnx.GraphProto, old: str, new: str) -> None:
    """Rename a tensor the graph defines: its producer's output, its uses and its value_info."""
    for node in graph.node:
        for index, name in enumerate(node.output):
            if name == old:
                node.output[index] = new
    rename_uses(graph, old, new)
    for value in graph.value_info:
        if value.name == old:
            value.name = new


def remove_unused_initializers(graph: onnx.GraphProto, candidates: set[str]) -> list[str]:
    """Remove the named initializers of this graph that nothing uses any more; returns their names."""
    counts = use_counts(graph)
    dead = [init.name for init in graph.initializer if init.name in candidates and not counts.get(init.name)]
    delete_where(graph.initializer, lambda init: init.name in dead)  # by index: ``remove`` compares whole tensors
    return dead
