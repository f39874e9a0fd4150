"""An If whose condition is a constant becomes the nodes of the branch it takes, in every graph.

This is onnxoptimizer's ``eliminate_if_with_const_cond``, done here because
onnxoptimizer's loses nodes when the inlined branch holds subgraphs that read
the branch's own values (Silero VAD's nested Ifs: the inner bodies are left
reading names nobody produces).  The branch's nodes take the If's place; each
If output gets an Identity from the branch output (onnxoptimizer's
eliminate_identity removes those that can go); the branch's initializers
become Constant nodes, since the enclosing graph may be a subgraph too.

It edits through ``qdeploy.graph.edit`` (onnx-ir): a branch's nodes move with the values they read, outer-scope
reads included, so no name has to be resolved by hand.  The simplify stage runs it in its loop; the export stage
runs it after freezing an input (``model.inputs[].value``), so that the exported model itself holds no If its
frozen input decides.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from qdeploy.graph.edit import AI_ONNX_DOMAINS, editing
from qdeploy.graph.utils import subgraphs

if TYPE_CHECKING:
    import onnx
    import onnx_ir as ir

__all__ = ["inline_constant_ifs"]


def inline_constant_ifs(model: onnx.ModelProto) -> int:
    """Replace every If with a constant condition, in every graph, by its taken branch; how many."""
    if not _has_if(model.graph):
        return 0  # nothing to inline: no onnx-ir view to build
    with editing(model, nested=True) as edit:
        return _inline_in(edit.graph)


def _has_if(graph: onnx.GraphProto) -> bool:
    return any(node.op_type == "If" or any(_has_if(body) for body in subgraphs(node)) for node in graph.node)


def _inline_in(graph: ir.Graph) -> int:
    count = 0
    for node in list(graph):
        condition = _condition(node)
        if condition is None:
            continue
        _inline(graph, node, node.attributes["then_branch" if condition else "else_branch"].as_graph())
        count += 1
    if count:
        _unique_names(graph)
    for node in graph:
        for body in _bodies(node):
            count += _inline_in(body)
    return count


def _bodies(node: ir.Node) -> list[ir.Graph]:
    import onnx_ir as ir

    found: list[ir.Graph] = []
    for attr in node.attributes.values():
        if attr.type == ir.AttributeType.GRAPH:
            found.append(attr.as_graph())
        elif attr.type == ir.AttributeType.GRAPHS:
            found.extend(attr.as_graphs())
    return found


def _condition(node: ir.Node) -> bool | None:
    """The constant value of an If's condition; None when it is not an If or not constant.

    Constant means an initializer no graph input overrides, or a Constant node's output, in this graph or
    one around it (onnx-ir's values are shared across scopes, so a shadowing input is another value).
    """
    import onnx_ir as ir

    if node.op_type != "If" or node.domain not in AI_ONNX_DOMAINS or not node.inputs or node.inputs[0] is None:
        return None
    value = node.inputs[0]
    if value.is_graph_input():
        return None
    tensor = ir.convenience.get_const_tensor(value)
    if tensor is None:
        return None
    try:
        array = tensor.numpy()
    except Exception:  # an external or odd tensor: not a condition we can read
        return None
    return None if array.size != 1 else bool(array.reshape(-1)[0])


def _inline(graph: ir.Graph, node: ir.Node, branch: ir.Graph) -> None:
    """The branch's constants and nodes, then an Identity per If output, in the If's place."""
    import onnx_ir as ir

    constants = []
    for name, value in list(branch.initializers.items()):
        constant = ir.node("Constant", [], {"value": value.const_value}, name=f"{name}_constant")
        ir.convenience.replace_all_uses_with(value, constant.outputs[0], replace_graph_outputs=True)
        constant.outputs[0].name = name
        constants.append(constant)
    branch.initializers.clear()
    moved = list(branch)
    branch.remove(moved)
    graph.insert_before(node, [*constants, *moved])
    for source, target in zip(branch.outputs, node.outputs, strict=False):
        if not target.name:
            continue
        identity = ir.node("Identity", [source], name=f"{target.name}_from_branch")
        graph.insert_before(node, identity)
        name = target.name
        ir.convenience.replace_all_uses_with(target, identity.outputs[0], replace_graph_outputs=True)
        identity.outputs[0].name = name
    graph.remove(node, safe=True)


def _unique_names(graph: ir.Graph) -> None:
    """Node names unique within the graph (ONNX Runtime refuses two nodes of one name; exporters name the nodes
    of each branch on their own, so an inlined branch may repeat a name of its new graph)."""
    seen: set[str] = set()
    for node in graph:
        if not node.name:
            continue
        name, suffix = node.name, 0
        while name in seen:
            suffix += 1
            name = f"{node.name}_inlined{suffix}"
        node.name = name
        seen.add(name)
