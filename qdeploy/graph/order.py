"""Scope and order of every graph of a model: what ONNX Runtime checks when it loads one.

A graph is valid when its nodes are in topological order and every name a node
reads (its subgraphs' reads of outer-scope names included) is produced before
it in this graph, or is a graph input, an initializer, or visible from the
graphs around it.  Passes that rewrite subgraphs (onnxoptimizer inlining a
branch, folding inside a body) can break that; ``scope_problems`` finds it,
``sort_topologically`` repairs what is only an order problem.

Works on the protobuf node lists, not onnx-ir (``qdeploy.graph.edit``): its job is to find and repair graphs
that read names before producing them, and a sort only moves messages (no node changes), which an edit
session would add a whole deserialise and write-back to.  ``sort_topologically`` is the one topological sort
of the project: simplify, the guard and the fp16 repair (``strict``) all call it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from qdeploy.graph.names import NodeNames
from qdeploy.graph.utils import delete_where, names_read, subgraphs

if TYPE_CHECKING:
    import onnx

__all__ = ["MAX_PROBLEMS", "drop_unread_constants", "outer_reads", "outer_references", "scope_problems",
           "sort_topologically", "subgraph_initializers_to_constants", "unread_subgraph_constants"]

MAX_PROBLEMS = 5


def scope_problems(graph: onnx.GraphProto, outer: Iterable[str] = (), *, where: str = "the main graph") -> list[str]:
    """Names read before they are produced, or never produced, in ``graph`` and its subgraphs (at most a few)."""
    defined = set(outer) | {""} | {value.name for value in graph.input} | {init.name for init in graph.initializer}
    defined |= {init.values.name for init in graph.sparse_initializer}
    problems: list[str] = []
    for node in graph.node:
        missing = [name for name in node.input if name not in defined]
        if missing:
            problems.append(f"{where}: node '{node.name or node.op_type}' ({node.op_type}) reads {missing[:3]} "
                            "before any node produces it")
        for sub in subgraphs(node):
            problems.extend(scope_problems(sub, defined, where=f"subgraph '{sub.name}' of node "
                                                              f"'{node.name or node.op_type}'"))
        defined.update(node.output)
        if len(problems) >= MAX_PROBLEMS:
            return problems[:MAX_PROBLEMS]
    missing_outputs = [value.name for value in graph.output if value.name not in defined]
    if missing_outputs:
        problems.append(f"{where}: outputs {missing_outputs[:3]} are produced by no node")
    return problems[:MAX_PROBLEMS]


def outer_reads(node: onnx.NodeProto) -> set[str]:
    """Names a node's subgraphs read that none of them defines: the node's implicit inputs."""
    reads: set[str] = set()
    for sub in subgraphs(node):
        reads |= outer_references(sub)
    return reads


def outer_references(graph: onnx.GraphProto) -> set[str]:
    """Names a (sub)graph, or anything nested in it, reads without defining them: its implicit inputs."""
    local = {value.name for value in graph.input} | {init.name for init in graph.initializer}
    local |= {init.values.name for init in graph.sparse_initializer}
    local |= {name for node in graph.node for name in node.output}
    reads = {name for node in graph.node for name in node.input}
    reads |= {value.name for value in graph.output}
    for node in graph.node:
        reads |= outer_reads(node)
    return {name for name in reads if name and name not in local}


def sort_topologically(graph: onnx.GraphProto, *, strict: bool = False) -> bool:
    """Put the nodes of ``graph`` and of all its subgraphs in a stable topological order; whether any moved.

    A node waits for the producers of its inputs and of the outer-scope names its subgraphs read (a name no
    node produces is an input, an initializer or an outer name: nothing to wait for).  Among ready nodes the
    one that came first stays first.  Nodes in a cycle keep their relative order at the end (``scope_problems``
    then names them); with ``strict`` (a pass that made the graph itself and must not leave one), a cycle
    raises ValueError naming its nodes instead.
    """
    changed = False
    for node in graph.node:
        for sub in subgraphs(node):
            changed |= sort_topologically(sub, strict=strict)
    nodes = list(graph.node)
    producer = {name: index for index, node in enumerate(nodes) for name in node.output if name}
    waits: list[set[int]] = []
    for index, node in enumerate(nodes):
        needs = {producer[name] for name in (*node.input, *outer_reads(node)) if name in producer}
        needs.discard(index)
        waits.append(needs)
    order, resolved = _kahn(waits)
    if strict and resolved < len(nodes):
        stuck = [nodes[index].name or nodes[index].op_type for index in order[resolved:]][:MAX_PROBLEMS]
        raise ValueError(f"graph '{graph.name}' has a cycle through nodes {stuck}")
    if order == list(range(len(nodes))):
        return changed
    copies = [nodes[index] for index in order]
    del graph.node[:]
    graph.node.extend(copies)
    return True


def _kahn(waits: list[set[int]]) -> tuple[list[int], int]:
    """Indices in dependency order, the smallest ready index first (stable), then the unresolvable ones in their
    order; and how many were resolved."""
    import heapq

    blocked = [len(needs) for needs in waits]
    followers: list[list[int]] = [[] for _ in waits]
    for index, needs in enumerate(waits):
        for need in needs:
            followers[need].append(index)
    ready = [index for index, count in enumerate(blocked) if count == 0]
    heapq.heapify(ready)
    order: list[int] = []
    while ready:
        index = heapq.heappop(ready)
        order.append(index)
        for follower in followers[index]:
            blocked[follower] -= 1
            if blocked[follower] == 0:
                heapq.heappush(ready, follower)
    placed, resolved = set(order), len(order)
    order.extend(index for index in range(len(waits)) if index not in placed)
    return order, resolved


def subgraph_initializers_to_constants(graph: onnx.GraphProto, names: NodeNames | None = None) -> int:
    """Turn the initializers of every subgraph below ``graph`` into Constant nodes at the start of that subgraph.

    Exporters write subgraph constants as Constant nodes, and tools follow: onnxoptimizer's
    eliminate_if_with_const_cond inlines a branch's nodes but drops the branch's initializers, leaving reads
    of names nobody produces.  The top-level graph keeps its initializers.
    """
    from onnx import helper

    names = names if names is not None else NodeNames.of(graph)  # one for the whole walk: no repeated names
    moved = 0
    for node in graph.node:
        for sub in subgraphs(node):
            moved += subgraph_initializers_to_constants(sub, names)
            shadowed = {value.name for value in sub.input}  # legacy: an initializer that is also an input
            constants = [helper.make_node("Constant", [], [init.name], name=names.fresh(f"{init.name}_constant"),
                                          value=init)
                         for init in sub.initializer if init.name not in shadowed]
            if not constants:
                continue
            kept = [init for init in sub.initializer if init.name in shadowed]
            nodes = list(sub.node)
            del sub.node[:]
            sub.node.extend([*constants, *nodes])
            del sub.initializer[:]
            sub.initializer.extend(kept)
            moved += len(constants)
    return moved


def unread_subgraph_constants(graph: onnx.GraphProto) -> int:
    """Remove Constant nodes of subgraphs whose output nothing reads; how many."""
    removed = 0
    for node in graph.node:
        for sub in subgraphs(node):
            removed += unread_subgraph_constants(sub)
            removed += drop_unread_constants(sub)
    return removed


def drop_unread_constants(graph: onnx.GraphProto) -> int:
    read = names_read(list(graph.node), graph)
    return delete_where(graph.node, lambda node: node.op_type == "Constant" and not node.input
                        and all(name not in read for name in node.output))
