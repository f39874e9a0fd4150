"""Each QuantizeLinear/DequantizeLinear reads scale and zero point initializers of its own.

ONNX Runtime's QDQ quantizer gives a data-movement op (Gather, Pad, Unsqueeze,
Transpose, Squeeze, Reshape...) the scale and zero point of its input, by name:
along a chain such as Gather -> Pad -> Unsqueeze -> Transpose -> Conv one
``emb_scale``/``emb_zero_point`` pair is read by every Q/DQ node.  OpenVINO's ONNX
frontend turns an initializer into one Constant node, and its low-precision
``PadTransformation`` (constant mode, non-zero zero point) replaces the
dequantization's zero-point Constant *in place* (``replace_node``) by one
broadcast along the padded axis and then padded: every other dequantization
reading that Constant gets a per-position zero point shaped like the padded
tensor.  Where the shapes disagree the model does not compile ("Argument shapes
are inconsistent", a tf2onnx text CNN with causal Conv1D padding); where they
broadcast, other tensors subtract the wrong zero point at the padded positions
and the results are silently wrong.  Owning its constants, each dequantization
is rewritten alone.  ONNX Runtime compares scale and zero point values, not
names, when it fuses Q/DQ pairs: its kernels are unchanged.

Edits protobuf directly: a pass over ORT's quantizer output, linear in the node count.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from qdeploy.graph.utils import fresh_name

if TYPE_CHECKING:
    import onnx

_QDQ = ("QuantizeLinear", "DequantizeLinear")


def unshare_qdq_parameters(model: onnx.ModelProto) -> int:
    """Give every Q/DQ node its own copy of any scale or zero point initializer another node also reads.

    Weights (a DequantizeLinear's first input) stay shared.  Returns how many copies were made.
    """
    graph = model.graph
    initializers = {init.name: init for init in graph.initializer}
    taken = set(initializers) | {out for node in graph.node for out in node.output} \
        | {value.name for value in graph.input}
    readers: dict[str, int] = {}
    for node in graph.node:
        for name in node.input:
            readers[name] = readers.get(name, 0) + 1
    claimed: set[str] = set()
    copies = 0
    for node in graph.node:
        if node.op_type not in _QDQ:
            continue
        for index in (1, 2):
            if index >= len(node.input):
                continue
            name = node.input[index]
            if name not in initializers or readers.get(name, 0) < 2:
                continue
            if name not in claimed:  # the first reader keeps the original
                claimed.add(name)
                continue
            node.input[index] = _copy(graph, initializers[name], fresh_name(f"{name}_{node.name or copies}", taken))
            copies += 1
    return copies


def _copy(graph: onnx.GraphProto, source: onnx.TensorProto, name: str) -> str:
    copied = graph.initializer.add()
    copied.CopyFrom(source)
    copied.name = name
    return name
