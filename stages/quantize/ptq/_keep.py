"""Keeping nodes of a QDQ model in float: feed them the float values their quantized inputs stand for.

A kept node's input that comes from a DequantizeLinear is replaced by the float
tensor of the float model that the DequantizeLinear stands for:

- an activation: the quantized model's tensor that holds the same value, found
  through the producer of the float tensor (the node of the same name);
- a weight or bias: the float initializer (renamed when ORT gave its name to a
  DequantizeLinear output);
- a value whose producer ORT removed: ORT's QDQ quantizer drops a Relu or Clip
  after a quantized node and renames the node's output to the activation's
  (the uint8 range clips negatives in its place).  Read in float, that tensor
  is the value *before* the Relu; a float copy of the removed node is put
  back for the kept node to read (reading it directly made the "float" model
  worse than the quantized one).

Data-movement nodes whose consumers all run float follow them, and so does the
HardSigmoid gate of a kept HardSwish's Mul: read quantized while the Mul reads
float, the pair could neither be recomposed for OpenVINO nor compute a HardSwish
(PP-OCRv5 det: 24 such gates left the model at cosine 0.92 with every candidate
float).  Every step is linear in the model's size (the budget builds many models).

Edits protobuf directly: its input is ORT's quantizer output and the budget builds many such models.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from qdeploy.graph.names import NodeNames
from qdeploy.graph.utils import delete_where, node_readers, subgraph_references

if TYPE_CHECKING:
    import onnx

QDQ_OPS = ("QuantizeLinear", "DequantizeLinear")
RESCALING = "_rescaled_mul"
"""Name suffix of the Mul a rescaled depthwise input reads through (``_depthwise``): dropped with its pair when the
convolution is kept float."""
MOVER_OPS = frozenset({
    "Reshape", "Transpose", "Squeeze", "Unsqueeze", "Identity", "Flatten", "Slice", "Split", "Gather",
    "GatherElements", "MaxPool", "Pad", "DepthToSpace", "SpaceToDepth", "Expand", "Tile", "Shape", "Size",
    "ArgMax", "Resize",
})
"""Ops that move or select values: in int8 they add no rounding of their own."""


def quantized_node_names(model: onnx.ModelProto) -> dict[str, str]:
    """Name -> op type of the nodes that run quantized: fed by a DequantizeLinear, or integer ops."""
    dequantized = {out for node in model.graph.node if node.op_type == "DequantizeLinear" for out in node.output}
    return {node.name: node.op_type for node in model.graph.node if node.op_type not in QDQ_OPS
            and ("Integer" in node.op_type or any(name in dequantized for name in node.input))}


class _FloatValues:
    """Names, in the quantized model, of tensors holding the float model's values (created when missing)."""

    def __init__(self, model: onnx.ModelProto, float_model: onnx.ModelProto) -> None:
        self.model = model
        self.float_producers = {out: (node, index) for node in float_model.graph.node
                                for index, out in enumerate(node.output)}
        self.float_initializers = {init.name: init for init in float_model.graph.initializer}
        self.graph_inputs = {value.name for value in model.graph.input}
        self.nodes = {node.name: node for node in model.graph.node if node.name}
        self.initializers = {init.name for init in model.graph.initializer}
        self.taken = {out for node in model.graph.node for out in node.output} | self.initializers
        self.node_names = NodeNames.of(model.graph)  # the copies' node names repeat none
        self.resolved: dict[str, str] = {}
        self.created: list[onnx.NodeProto] = []
        """Float copies of removed nodes, in dependency order, not yet placed in the graph."""

    def of(self, name: str) -> str:
        """The quantized model's name for the float model's tensor ``name``."""
        if not name or name in self.graph_inputs:
            return name
        if name not in self.resolved:
            self.resolved[name] = self._resolve(name)
        return self.resolved[name]

    def _resolve(self, name: str) -> str:
        if name in self.float_initializers:
            return self._initializer(name)
        produced = self.float_producers.get(name)
        if produced is None:
            return name
        float_node, index = produced
        twin = self.nodes.get(float_node.name)
        if twin is not None and twin.op_type == float_node.op_type and len(twin.output) > index:
            return twin.output[index]
        return self._recreate(float_node)[index]

    def _recreate(self, float_node: onnx.NodeProto) -> list[str]:
        """A float copy of a node ORT removed, reading float values; its output names."""
        import onnx

        copy = onnx.NodeProto()
        copy.CopyFrom(float_node)
        copy.name = self.node_names.derived(float_node.name, "_float", float_node.op_type)
        del copy.input[:]
        copy.input.extend(self.of(name) for name in float_node.input)
        del copy.output[:]
        copy.output.extend(self._fresh(f"{out}_float") if out else "" for out in float_node.output)
        self.created.append(copy)
        return list(copy.output)

    def _initializer(self, original: str) -> str:
        """The float initializer in the model (renamed when ORT gave its name to a DequantizeLinear output)."""
        if original in self.initializers and original not in self.taken - self.initializers:
            return original
        name = self._fresh(original if original not in self.taken else f"{original}_float")
        copied = self.model.graph.initializer.add()
        copied.CopyFrom(self.float_initializers[original])
        copied.name = name
        self.initializers.add(name)
        return name

    def _fresh(self, base: str) -> str:
        name = base
        while name in self.taken:
            name += "_float" if not name.endswith("_float") else "_"
        self.taken.add(name)
        return name


def keep_float(model: onnx.ModelProto, float_model: onnx.ModelProto, kept: set[str]) -> None:
    """Feed the kept nodes their float inputs again; remove the Q/DQ nodes and initializers left unused."""
    originals = {node.name: node for node in float_model.graph.node}
    producers = {out: node for node in model.graph.node for out in node.output}
    kept = kept | _hardswish_gates(producers, model, kept)
    kept = kept | _float_movers(model, kept)
    values = _FloatValues(model, float_model)
    placed: list[onnx.NodeProto] = []
    for node in model.graph.node:
        if node.name in kept and node.name in originals:
            original = originals[node.name]
            for index, name in enumerate(node.input):
                dequantize = producers.get(name)
                if dequantize is not None and dequantize.op_type == "DequantizeLinear" \
                        and index < len(original.input):
                    node.input[index] = values.of(original.input[index])
            placed.extend(values.created)  # copies of removed nodes go right before their first reader
            values.created.clear()
        placed.append(node)
    if len(placed) != len(model.graph.node):
        del model.graph.node[:]
        model.graph.node.extend(placed)
    _float_graph_outputs(model, kept)
    remove_unused(model)


def _float_graph_outputs(model: onnx.ModelProto, kept: set[str]) -> None:
    """A kept node whose output reaches a graph output only through a Q -> DQ pair (ORT quantizes a Conv's output
    even there) writes the graph output itself: with every candidate kept float, the model is the float model."""
    outputs = {value.name for value in model.graph.output}
    readers = node_readers(model.graph.node)
    dropped: set[str] = set()
    for node in model.graph.node:
        if node.name not in kept:
            continue
        for index, name in enumerate(node.output):
            quantize = readers.get(name, [])
            if len(quantize) != 1 or quantize[0].op_type != "QuantizeLinear" or name in outputs:
                continue
            dequantize = readers.get(quantize[0].output[0], [])
            pair = (quantize[0], *dequantize)
            if len(dequantize) == 1 and dequantize[0].op_type == "DequantizeLinear" and all(n.name for n in pair) \
                    and dequantize[0].output[0] in outputs and not readers.get(dequantize[0].output[0]):
                node.output[index] = dequantize[0].output[0]
                dropped |= {n.name for n in pair}
    if dropped:  # ORT names every Q/DQ node it adds, uniquely
        delete_where(model.graph.node, lambda candidate: candidate.name in dropped)


def _hardswish_gates(producers: dict[str, onnx.NodeProto], model: onnx.ModelProto, kept: set[str]) -> set[str]:
    """HardSigmoid nodes that gate a kept Mul by the Mul's own other input (a HardSwish written out), the Q/DQ pairs
    in between looked through; ``producers``: the model's, by output name."""
    def source(name: str) -> str:  # the float tensor a Q -> DQ pair stands for
        dequantize = producers.get(name)
        if dequantize is not None and dequantize.op_type == "DequantizeLinear":
            quantize = producers.get(dequantize.input[0])
            if quantize is not None and quantize.op_type == "QuantizeLinear":
                return quantize.input[0]
        return name

    gates = set()
    for node in model.graph.node:
        if node.name not in kept or node.op_type != "Mul" or len(node.input) != 2:
            continue
        for gated, data in ((node.input[0], node.input[1]), (node.input[1], node.input[0])):
            gate = producers.get(gated)
            if gate is not None and gate.op_type == "HardSigmoid" and source(gate.input[0]) == source(data):
                gates.add(gate.name)
    return gates - kept


def _float_movers(model: onnx.ModelProto, kept: set[str]) -> set[str]:
    """Quantized data-movement nodes (Reshape, Transpose...) whose consumers all run float: they join the kept
    nodes, or they would hand their float consumers quantized values.  One pass from the outputs back (the
    graph is topologically sorted), so a chain of movers is settled in linear time."""
    consumers = node_readers(model.graph.node)
    quantized = set(quantized_node_names(model))
    floats = set(kept)
    for node in reversed(model.graph.node):
        if node.op_type in MOVER_OPS and node.name in quantized and node.name not in floats \
                and not any(c.name in quantized and c.name not in floats for c in _final_consumers(node, consumers)):
            floats.add(node.name)
    return floats - set(kept)


def _final_consumers(node: onnx.NodeProto, consumers: dict[str, list[onnx.NodeProto]]) -> list[onnx.NodeProto]:
    """The nodes reading the node's outputs, looking through QuantizeLinear -> DequantizeLinear."""
    found = []
    pending = list(node.output)
    while pending:
        for consumer in consumers.get(pending.pop(), []):
            if consumer.op_type in QDQ_OPS:
                pending.extend(consumer.output)
            else:
                found.append(consumer)
    return found


def remove_unused(model: onnx.ModelProto) -> None:
    """Drop Q/DQ nodes (and :data:`RESCALING` Muls) whose outputs nobody reads (back to front, so chains go in one
    pass), then initializers nobody reads."""
    graph = model.graph
    read: dict[str, int] = {}
    for node in graph.node:
        for name in node.input:
            read[name] = read.get(name, 0) + 1
    outputs = {value.name for value in graph.output} | subgraph_references(graph)
    dead = []
    for index in range(len(graph.node) - 1, -1, -1):
        node = graph.node[index]
        removable = node.op_type in QDQ_OPS or (node.op_type == "Mul" and node.name.endswith(RESCALING))
        if removable and not any(read.get(out) or out in outputs for out in node.output):
            dead.append(index)
            for name in node.input:
                read[name] -= 1
    if dead:
        _delete_nodes(graph, set(dead))
    used = {name for name, count in read.items() if count} | outputs
    delete_where(graph.initializer, lambda init: init.name not in used)


def _delete_nodes(graph: onnx.GraphProto, doomed: set[int]) -> None:
    """Delete nodes by index, rebuilding the list once (each protobuf delete shifts the rest: quadratic)."""
    kept = [node for index, node in enumerate(graph.node) if index not in doomed]
    del graph.node[:]
    graph.node.extend(kept)
