"""Graph plumbing of the fp16 stage: scopes, unique names, Casts and topological order.

Pure protobuf edits, no numerics.  Names are treated as unique across the whole
model (ONNX's SSA rule, subgraphs included), so one map from tensor name to its
producer, owner graph and type serves every scope.

Edits protobuf directly, as onnxconverter-common (whose output it repairs) does; moving the fp16 stage onto
``qdeploy.graph.edit`` is not done.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from qdeploy.graph.utils import GRAPH_OPS, STANDARD_DOMAINS, subgraphs

if TYPE_CHECKING:
    import onnx


FLOAT, FLOAT16 = 1, 10  # onnx.TensorProto element types


def walk_graphs(graph: onnx.GraphProto) -> Iterator[onnx.GraphProto]:
    """The graph and every graph nested in it, outer graphs first."""
    yield graph
    for node in graph.node:
        if node.op_type in GRAPH_OPS or node.domain not in STANDARD_DOMAINS:  # inline fast path of subgraphs()
            for sub in subgraphs(node):
                yield from walk_graphs(sub)


def walk_nodes(graph: onnx.GraphProto) -> Iterator[tuple[onnx.NodeProto, onnx.GraphProto]]:
    """Every node of the graph and of its nested graphs, with the graph that holds it."""
    for inner in walk_graphs(graph):
        for node in inner.node:
            yield node, inner


def defined_here(graph: onnx.GraphProto) -> set[str]:
    """Names the graph itself defines: inputs, initializers and node outputs."""
    names = {value.name for value in graph.input}
    names.update(init.name for init in graph.initializer)
    names.update(sparse.values.name for sparse in graph.sparse_initializer)
    names.update(out for node in graph.node for out in node.output if out)
    return names


def outer_references(graph: onnx.GraphProto) -> set[str]:
    """Names a subgraph (or anything nested in it) uses without defining them: its implicit inputs."""
    defined = defined_here(graph)
    used = {name for node in graph.node for name in node.input if name}
    used.update(value.name for value in graph.output)
    for node in graph.node:
        for sub in subgraphs(node):
            used.update(outer_references(sub))
    return used - defined


def node_dependencies(node: onnx.NodeProto) -> list[str]:
    """Tensors a node needs before it runs: explicit inputs plus its subgraphs' outer references."""
    names = [name for name in node.input if name]
    for sub in subgraphs(node):
        names.extend(sorted(outer_references(sub)))
    return names


def name_nodes_uniquely(model: onnx.ModelProto, prefix: str = "") -> int:
    """Give every node of every graph a name no other node has; returns how many were (re)named."""
    taken: set[str] = set()
    renamed = 0
    for node, _ in walk_nodes(model.graph):
        if node.name and node.name not in taken:
            taken.add(node.name)
            continue
        base = node.name or f"{prefix}{node.op_type}_{node.output[0] if node.output else 'node'}"
        candidate, suffix = base, 1
        while candidate in taken:
            candidate = f"{base}_{suffix}"
            suffix += 1
        node.name = candidate
        taken.add(candidate)
        renamed += 1
    return renamed


def _replace_repeated(field: Any, items: list[Any]) -> None:
    """Set a repeated protobuf field to these messages (copied first: clearing the field invalidates them)."""
    copies = [type(item)() for item in items]
    for copy, item in zip(copies, items, strict=True):
        copy.CopyFrom(item)
    del field[:]
    field.extend(copies)


def topological_sort(graph: onnx.GraphProto) -> None:
    """Order nodes so each comes after the producers of what it uses (subgraph references included).

    Stable: among ready nodes the one that came first stays first.  Recurses into subgraphs.
    ValueError on a cycle.
    """
    nodes = list(graph.node)
    producer = {out: index for index, node in enumerate(nodes) for out in node.output if out}
    waiting = [0] * len(nodes)
    users: list[list[int]] = [[] for _ in nodes]
    for index, node in enumerate(nodes):
        for source in {producer[name] for name in node_dependencies(node) if name in producer}:
            if source != index:
                waiting[index] += 1
                users[source].append(index)
    ready = [index for index, count in enumerate(waiting) if count == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        index = heapq.heappop(ready)
        order.append(index)
        for user in users[index]:
            waiting[user] -= 1
            if waiting[user] == 0:
                heapq.heappush(ready, user)
    if len(order) != len(nodes):
        stuck = [nodes[index].name for index in range(len(nodes)) if waiting[index]][:5]
        raise ValueError(f"graph '{graph.name}' has a cycle through nodes {stuck}")
    if order != list(range(len(nodes))):
        _replace_repeated(graph.node, [nodes[index] for index in order])
    for node in graph.node:
        for sub in subgraphs(node):
            topological_sort(sub)


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
        keep = [node for node in graph.node if not (node.op_type == "Cast" and node.output[0] in dead)]
        copies = [type(node)() for node in keep]
        for copy, node in zip(copies, keep, strict=True):
            copy.CopyFrom(node)
        del graph.node[:]
        graph.node.extend(copies)
    removed = len(dead)
    for node in graph.node:
        for sub in subgraphs(node):
            removed += remove_dead_casts(sub)
    return removed


def rename_uses(graph: onnx.GraphProto, old: str, new: str, *, outputs: bool = True) -> None:
    """Every use of `old` as a node input (nested graphs included), and as a graph output, becomes `new`."""
    for inner in walk_graphs(graph):
        for node in inner.node:
            for index, name in enumerate(node.input):
                if name == old:
                    node.input[index] = new
    if outputs:
        for value in graph.output:
            if value.name == old:
                value.name = new


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


def prune_value_info(graph: onnx.GraphProto) -> None:
    """Drop value_info entries of tensors that no longer exist; recurse into subgraphs."""
    existing = {out for node in graph.node for out in node.output if out}
    existing.update(name for node in graph.node for name in node.input if name)
    keep = [value for value in graph.value_info if value.name in existing]
    if len(keep) != len(graph.value_info):
        _replace_repeated(graph.value_info, keep)
    for node in graph.node:
        for sub in subgraphs(node):
            prune_value_info(sub)


def remove_unused_initializers(graph: onnx.GraphProto, candidates: set[str]) -> list[str]:
    """Remove the named initializers of this graph that nothing uses any more; returns their names."""
    counts = use_counts(graph)
    dead = [init for init in graph.initializer if init.name in candidates and not counts.get(init.name)]
    for init in dead:
        graph.initializer.remove(init)
    return [init.name for init in dead]
