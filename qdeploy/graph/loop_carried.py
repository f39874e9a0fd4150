"""Loop and Scan bodies that return a loop-carried value unchanged: an Identity in between.

ONNX lets a Loop body list one of its inputs among its outputs: the value goes
round unchanged (Paddle2ONNX carries a decoder's loop-invariant weights through
its Loop that way, 16 of them in a table-structure model).  OpenVINO's ONNX
frontend (2026.4, ``loop.cpp``, its check on loop-carried dependencies)
refuses such a Loop; with an Identity between the body's input and its output
it reads and runs it, and no value changes.

onnxoptimizer's ``eliminate_identity`` removes that Identity again, so the
rewrite is not a simplification stored in an artifact: the OpenVINO adapter
applies it to the copy it hands OpenVINO (``qdeploy.targets.openvino_read``),
whatever stage wrote the file.  Nested bodies (a Loop in an If branch or in
another Loop) are rewritten too.

Edits protobuf directly: the model may be a graph without its weights.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from qdeploy.graph.names import NodeNames, all_nodes
from qdeploy.graph.utils import fresh_name, subgraphs

if TYPE_CHECKING:
    import onnx

__all__ = ["CARRYING_OPS", "isolate_pass_through"]

log = logging.getLogger(__name__)

CARRYING_OPS = {"Loop": 1, "Scan": 0}
"""Op -> index of its body's first output that may carry a value (a Loop body's output 0 is its condition)."""


def isolate_pass_through(model: onnx.ModelProto) -> list[str]:
    """Give every Loop/Scan body output that is one of the body's own inputs an Identity of its own, in place, in
    every graph of the model; ``"<op> '<node>': <value>"`` for each value so rewritten."""
    graph = model.graph
    loops = [node for node in all_nodes(graph) if node.op_type in CARRYING_OPS and node.domain in ("", "ai.onnx")]
    if not loops:
        return []
    taken = tensor_names(graph)
    names = NodeNames.of(graph)
    rewritten: list[str] = []
    for node in loops:
        for body in (attr.g for attr in node.attribute if attr.name == "body" and attr.HasField("g")):
            rewritten += _isolate(node, body, taken, names)
    if rewritten:
        log.info("an Identity put between %d loop-carried value(s) and the body outputs returning them unchanged: %s",
                 len(rewritten), ", ".join(rewritten[:5]))
    return rewritten


def _isolate(node: onnx.NodeProto, body: onnx.GraphProto, taken: set[str], names: NodeNames) -> list[str]:
    from onnx import helper

    inputs = {value.name for value in body.input}
    rewritten = []
    for output in list(body.output)[CARRYING_OPS[node.op_type]:]:
        if output.name not in inputs:
            continue
        value = output.name
        output.name = fresh_name(f"{value}_carried", taken)
        body.node.append(helper.make_node("Identity", [value], [output.name],
                                          name=names.derived(node.name, f"_{value}_carried", node.op_type)))
        rewritten.append(f"{node.op_type} '{node.name}': {value}")
    return rewritten


def tensor_names(graph: onnx.GraphProto) -> set[str]:
    """Every tensor name of ``graph`` and of the graphs nested in it: inputs, outputs, initializers, value_info,
    node inputs and outputs."""
    names = {value.name for value in (*graph.input, *graph.output, *graph.value_info)}
    names.update(init.name for init in graph.initializer)
    for node in graph.node:
        names.update(node.input)
        names.update(node.output)
        for sub in subgraphs(node):
            names |= tensor_names(sub)
    names.discard("")
    return names
