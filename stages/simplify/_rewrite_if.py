"""An If whose condition is a constant becomes the nodes of the branch it takes, in every graph.

This is onnxoptimizer's ``eliminate_if_with_const_cond``, done here because
onnxoptimizer's loses nodes when the inlined branch holds subgraphs that read
the branch's own values (Silero VAD's nested Ifs: the inner bodies are left
reading names nobody produces).  The branch's nodes take the If's place; each
If output gets an Identity from the branch output (onnxoptimizer's
eliminate_identity removes those that can go); the branch's initializers
become Constant nodes, since the enclosing graph may be a subgraph too.

Edits protobuf directly: it runs between onnxoptimizer calls on the message they share and moves whole
subgraphs across scopes; moving it onto ``qdeploy.graph.edit`` is not done.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from qdeploy.graph.utils import subgraphs

if TYPE_CHECKING:
    import numpy as np
    import onnx

PASS_NAME = "eliminate_if_with_const_cond"


def inline_constant_ifs(model: onnx.ModelProto) -> int:
    """Replace every If with a constant condition, in every graph, by its taken branch; how many."""
    overridable = {value.name for value in model.graph.input} if model.ir_version >= 4 else set()
    constants = {init.name: init for init in model.graph.initializer if init.name not in overridable}
    return _inline_in(model.graph, constants)


def _inline_in(graph: onnx.GraphProto, outer: dict[str, onnx.TensorProto]) -> int:
    from qdeploy.stages.simplify._folding import constant_node_tensors

    visible = {name: tensor for name, tensor in outer.items() if name not in {v.name for v in graph.input}}
    visible.update((init.name, init) for init in graph.initializer)
    visible.update(constant_node_tensors(graph))
    count = 0
    nodes = list(graph.node)
    replaced: list[onnx.NodeProto] = []
    for node in nodes:
        condition = _condition(node, visible)
        if condition is None:
            replaced.append(node)
            continue
        branch = next(attr.g for attr in node.attribute if attr.name == ("then_branch" if condition else
                                                                          "else_branch"))
        replaced.extend(_branch_nodes(node, branch))
        count += 1
    if count:
        _unique_names(replaced)
        del graph.node[:]
        graph.node.extend(replaced)
        visible.update(constant_node_tensors(graph))
    for node in graph.node:
        for sub in subgraphs(node):
            count += _inline_in(sub, visible)
    return count


def _condition(node: onnx.NodeProto, constants: dict[str, onnx.TensorProto]) -> bool | None:
    """The constant value of an If's condition; None when it is not an If or not constant."""
    if node.op_type != "If" or node.domain not in ("", "ai.onnx") or not node.input:
        return None
    tensor = constants.get(node.input[0])
    if tensor is None:
        return None
    value = _value(tensor)
    if value is None or value.size != 1:
        return None
    return bool(value.reshape(-1)[0])


def _value(tensor: onnx.TensorProto) -> np.ndarray | None:
    from onnx import numpy_helper

    try:
        return numpy_helper.to_array(tensor)
    except Exception:  # an external or odd tensor: not a condition we can read
        return None


def _branch_nodes(node: onnx.NodeProto, branch: onnx.GraphProto) -> list[onnx.NodeProto]:
    """The branch's constants and nodes, then an Identity per If output."""
    from onnx import helper

    constants = [helper.make_node("Constant", [], [init.name], name=f"{init.name}_constant", value=init)
                 for init in branch.initializer]
    identities = [helper.make_node("Identity", [source.name], [target], name=f"{target}_from_branch")
                  for source, target in zip(branch.output, node.output, strict=False) if target]
    return [*constants, *branch.node, *identities]


def _unique_names(nodes: list[onnx.NodeProto]) -> None:
    """Node names unique within the graph (ONNX Runtime refuses two nodes of one name; exporters name the nodes
    of each branch on their own, so an inlined branch may repeat a name of its new graph)."""
    seen: set[str] = set()
    for node in nodes:
        if not node.name:
            continue
        name, suffix = node.name, 0
        while name in seen:
            suffix += 1
            name = f"{node.name}_inlined{suffix}"
        node.name = name
        seen.add(name)
