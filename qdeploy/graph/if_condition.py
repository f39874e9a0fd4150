"""If conditions of rank above 1: a Squeeze before the If, for OpenVINO's ONNX frontend.

ONNX asks an If's condition for one element, of any rank: PyTorch writes a ``[1, 1]`` one for ``if score >=
threshold`` on a ``[1, 1]`` score (openWakeWord's verifier models), and ONNX Runtime runs it.  OpenVINO's ONNX
frontend (2026.4, ``if.cpp``) refuses any condition of rank above 1 ("Rank of If condition input must be equal
to 0 or 1"), which makes the whole model unreadable there.  A Squeeze without axes turns the one element into a
scalar (each of its dimensions is 1); no value changes.

Like ``qdeploy.graph.loop_carried``, the OpenVINO adapter applies this to the copy it hands OpenVINO
(``qdeploy.targets.openvino_read``), whatever stage wrote the file; nested graphs are rewritten too.  A condition
whose rank shape inference cannot tell is squeezed as well: a Squeeze of one element is always exact.

Edits protobuf directly: the model may be a graph without its weights.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from qdeploy.graph.light import tensor_ranks
from qdeploy.graph.loop_carried import tensor_names
from qdeploy.graph.names import NodeNames, all_nodes
from qdeploy.graph.utils import ONNX_SPEC_DOMAINS, fresh_name, subgraphs

if TYPE_CHECKING:
    import onnx

__all__ = ["squeeze_if_conditions"]

log = logging.getLogger(__name__)

READABLE_RANKS = (0, 1)
"""The condition ranks OpenVINO's frontend reads."""


def squeeze_if_conditions(model: onnx.ModelProto) -> list[str]:
    """Read each If whose condition is not known to have rank 0 or 1 through a Squeeze of it, in place, in every
    graph of the model; ``"If '<node>': <condition>"`` for each so rewritten."""
    if not any(_is_if(node) for node in all_nodes(model.graph)):
        return []
    ranks = tensor_ranks(model)
    taken = tensor_names(model.graph)
    names = NodeNames.of(model.graph)
    rewritten: list[str] = []
    _rewrite(model.graph, ranks, taken, names, rewritten)
    if rewritten:
        log.info("the condition of %d If node(s) squeezed to a scalar: %s", len(rewritten), ", ".join(rewritten[:5]))
    return rewritten


def _is_if(node: onnx.NodeProto) -> bool:
    return node.op_type == "If" and node.domain in ONNX_SPEC_DOMAINS


def _rewrite(graph: onnx.GraphProto, ranks: dict[str, int], taken: set[str], names: NodeNames,
             rewritten: list[str]) -> None:
    from onnx import helper

    placed = []
    for node in graph.node:
        for sub in subgraphs(node):
            _rewrite(sub, ranks, taken, names, rewritten)
        if _is_if(node) and node.input and ranks.get(node.input[0]) not in READABLE_RANKS:
            condition = node.input[0]
            scalar = fresh_name(f"{condition}_scalar", taken)
            placed.append(helper.make_node("Squeeze", [condition], [scalar],
                                           name=names.derived(node.name, "_condition_scalar", node.op_type)))
            node.input[0] = scalar
            rewritten.append(f"If '{node.name}': {condition}")
        placed.append(node)
    if len(placed) != len(graph.node):
        del graph.node[:]
        graph.node.extend(placed)
