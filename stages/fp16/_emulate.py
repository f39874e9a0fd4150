"""Float16 arithmetic emulated on ONNX Runtime's float32 kernels.

ORT's CPU provider runs float16 ops without float16 kernels in float32 and drops
the Casts between neighbours, so an overflow inside such a chain never shows.
These models make every float16 value visible instead: every tensor that is
float16 in the artifact is rounded to float16 (Cast to float16 and back, which
gives Inf past 65504 exactly as float16 does) while ops compute in float32, as
GPU kernels do with float32 accumulation. A float16 Conv's or Gemm's product is
rounded before its bias is added, as float16 arithmetic without a fused bias does
(``_bias``): where the bias cancels most of the product, that rounding dominates.

- ``emulation_twin(fp16_model)``: the artifact itself, emulated; used to check it.
- ``gated_twin(fp32_model, gates)``: the float32 model where each gated node's
  float16 rounding is switched on or off by a boolean graph input, so one
  session answers every "which nodes stay float32" trial (budget mode).
  Subgraph bodies (If/Loop/Scan) are not rounded inside: their node is gated as a unit.

Edits protobuf directly, not through ``qdeploy.graph.edit``: a twin is a throwaway model for ONNX Runtime
that rewrites every float16 edge of every graph (each float16 output renamed and two Casts added), on a light
copy whose large weights are tags ``qdeploy.graph.light.restore`` fills in message by message.  An edit session
would read and write back every node of a model nobody keeps (costs in ``_graph``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from qdeploy.graph.light import light_copy, put_back, restore, tag_of
from qdeploy.graph.utils import place_after_producers, subgraphs
from qdeploy.stages.fp16._bias import split_biases
from qdeploy.stages.fp16._graph import FLOAT, FLOAT16, rename_uses, walk_graphs
from qdeploy.stages.fp16._rules import DTYPE_ATTRIBUTES
from qdeploy.stages.fp16._types import scope_types

if TYPE_CHECKING:
    import onnx

    from qdeploy.graph.light import Light

log = logging.getLogger(__name__)

GATES_INPUT = "__fp16_gates"
NO_ROUNDING_OPS = frozenset({"Constant", "ConstantOfShape"})


def emulation_twin(model: onnx.ModelProto, expose: bool = False) -> onnx.ModelProto:
    """A float32 copy of an fp16 artifact that rounds each of its float16 tensors to float16.

    Its large top-level float16 weights stay float16, each read through a Cast to float32 (exact), and are
    copied once, at the end: the twin of a 2 GB artifact holds 1 GB of float16, not 2 GB of float32 beside
    the artifact's own float16 bytes.
    """
    light = light_copy(model)
    twin = light.model
    _restore_interface(twin, light)
    graphs = list(walk_graphs(twin.graph))
    for graph in reversed(graphs):  # bodies first: rewriting a graph's node list copies the bodies inside it
        _emulate_graph(graph, top=graph is twin.graph)
    if expose:
        _add_nonfinite_probes(twin.graph)
    restore(twin, light)  # the tagged float16 weights get their bytes back
    return twin


NONFINITE_SUFFIX = "__nonfinite"
"""A probe output ``<tensor>__nonfinite``: NaN exactly when the tensor held an Inf or a NaN on that run."""


def _add_nonfinite_probes(graph: onnx.GraphProto) -> None:
    """For every float tensor of the main graph, a scalar output ``ReduceSum(x * 0)``: 0 for finite values, NaN
    where any is Inf or NaN.  Scalars instead of the tensors: the run holds one activation at a time, not every
    intermediate of the model (1.2 GB per sample on a 135M language model)."""
    from onnx import helper, numpy_helper

    listed = {value.name for value in graph.output}
    zero = f"{NONFINITE_SUFFIX}_zero"
    graph.initializer.append(numpy_helper.from_array(np.zeros((), np.float32), zero))
    probes: dict[str, list[onnx.NodeProto]] = {}
    for value in list(graph.value_info):
        if value.type.tensor_type.elem_type != FLOAT or value.name in listed:
            continue
        probe = f"{value.name}{NONFINITE_SUFFIX}"
        probes[value.name] = [helper.make_node("Mul", [value.name, zero], [f"{probe}_times_zero"]),
                              helper.make_node("ReduceSum", [f"{probe}_times_zero"], [probe], keepdims=0)]
        graph.output.append(helper.make_tensor_value_info(probe, FLOAT, []))
    # right after each tensor's producer: the twin runs in the model's order, and probes at the end would keep
    # every activation alive until then
    place_after_producers(graph, probes)


def _emulate_graph(graph: onnx.GraphProto, top: bool) -> None:
    from onnx import numpy_helper

    types = scope_types(graph)
    split_biases(graph, types, FLOAT16)  # the product is rounded before its bias, as float16 arithmetic does
    read_through_cast = _weights_read_through_casts(graph) if top else []
    for init in graph.initializer:
        if init.data_type == FLOAT16 and init.name not in read_through_cast:
            init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init).astype("float32"), init.name))
    upcasts = _upcasts(graph, read_through_cast)
    ordered: list[onnx.NodeProto] = []  # each rounding right after its producer: every graph stays sorted
    for node in list(graph.node):
        # a weight's Cast right before its first reader: ORT frees its float32 copy after its last one
        ordered.extend(upcasts.pop(name) for name in _reads(node) if name in upcasts)
        ordered.append(node)
        _tensor_attributes_to_float32(node)
        attr_name = DTYPE_ATTRIBUTES.get(node.op_type)
        for attr in node.attribute:
            if attr.name == attr_name and attr.i == FLOAT16 and node.op_type != "Cast":
                attr.i = FLOAT
        if node.op_type in NO_ROUNDING_OPS:
            continue
        for index, out in enumerate(node.output):
            if out and types.get(out) == FLOAT16:  # the node computes in float32; its result is rounded
                node.output[index] = f"{out}__emulated_raw"
                ordered.extend(_round_nodes(node.output[index], out))
    leading = list(upcasts.values())  # read by no node: kept, harmless
    for value in graph.input:
        if value.type.tensor_type.elem_type == FLOAT16:
            value.type.tensor_type.elem_type = FLOAT
            if top:  # the artifact takes float16 feeds: round what the caller gives
                rounded = f"{value.name}__emulated_in"
                rename_uses(graph, value.name, rounded, outputs=False)
                leading.extend(_round_nodes(value.name, rounded))
    del graph.node[:]
    graph.node.extend([*leading, *ordered])
    for value in (*graph.value_info, *graph.output):
        if value.type.tensor_type.elem_type == FLOAT16:
            value.type.tensor_type.elem_type = FLOAT


def _restore_interface(twin: onnx.ModelProto, light: Light) -> None:
    """Initializers that are also graph inputs or outputs (IR < 4 lists weights as inputs) get their bytes back
    at once: they are upcast like small ones, which reads their values."""
    interface = {value.name for value in (*twin.graph.input, *twin.graph.output)}
    for init in twin.graph.initializer:
        tag = tag_of(init)
        if tag is not None and init.name in interface:
            put_back(init, light.originals[tag])


def _weights_read_through_casts(graph: onnx.GraphProto) -> list[str]:
    """Top-level float16 weights a light copy holds as tags (the large ones) that only nodes read."""
    interface = {value.name for value in (*graph.input, *graph.output)}
    return [init.name for init in graph.initializer
            if init.data_type == FLOAT16 and init.name not in interface and tag_of(init) is not None]


def _upcasts(graph: onnx.GraphProto, weights: list[str]) -> dict[str, onnx.NodeProto]:
    """A Cast to float32 per float16 weight, by the name its readers (nested graphs included) now read."""
    from onnx import helper

    renamed = {name: f"{name}__emulated_f32" for name in weights}
    if not renamed:
        return {}
    for inner in walk_graphs(graph):
        for node in inner.node:
            for index, name in enumerate(node.input):
                if name in renamed:
                    node.input[index] = renamed[name]
    return {target: helper.make_node("Cast", [name], [target], name=f"{target}_cast", to=FLOAT)
            for name, target in renamed.items()}


def _reads(node: onnx.NodeProto) -> list[str]:
    """The names a node reads, its subgraphs' reads of outer names included."""
    names = list(node.input)
    for body in subgraphs(node):
        names.extend(name for inner in walk_graphs(body) for n in inner.node for name in n.input)
    return names


def _round_nodes(source: str, target: str) -> list[onnx.NodeProto]:
    """source -> float16 -> float32 target (round to nearest even, Inf past float16's range)."""
    from onnx import helper

    half = f"{target}__emulated_half"
    return [helper.make_node("Cast", [source], [half], name=f"{half}_cast", to=FLOAT16),
            helper.make_node("Cast", [half], [target], name=f"{target}_emulated_cast", to=FLOAT)]


def _tensor_attributes_to_float32(node: onnx.NodeProto) -> None:
    """Float16 tensors in attributes (Constant, ConstantOfShape values) become float32, same values."""
    from onnx import numpy_helper

    for attr in node.attribute:
        tensors = ([attr.t] if attr.HasField("t") else []) + list(attr.tensors)
        for tensor in tensors:
            if tensor.data_type == FLOAT16:
                tensor.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(tensor).astype("float32"), tensor.name))


def gated_twin(model: onnx.ModelProto, gate_of: dict[str, int], float32_inputs: dict[str, set[int]],
               keep_io_types: bool, to_float16: Callable[[np.ndarray], np.ndarray]) -> onnx.ModelProto:
    """The float32 model with float16 rounding per node, switched by GATES_INPUT[gate_of[node]].

    A tensor is rounded for a reader when its producer's gate or the reader's gate is on (the reader sees
    float16), except on inputs that stay float32 (`float32_inputs`).  Nodes without a gate stay float32.
    """
    import onnx
    from onnx import TensorProto, helper

    twin = onnx.ModelProto()
    twin.CopyFrom(model)
    graph = twin.graph
    split = split_biases(graph, scope_types(graph), FLOAT, names=set(gate_of))  # the bias Add: the node's gate
    gate_of = {**gate_of, **{add: gate_of[node] for add, node in split.items()}}
    builder = _GatedBuilder(graph, gate_of, float32_inputs, keep_io_types, to_float16)
    builder.build()
    count = max(gate_of.values(), default=-1) + 1
    graph.input.append(helper.make_tensor_value_info(GATES_INPUT, TensorProto.BOOL, [count]))
    return twin


class _GatedBuilder:
    """Rewires every float edge of the main graph through If(gate, rounded, raw)."""

    def __init__(self, graph: onnx.GraphProto, gate_of: dict[str, int], float32_inputs: dict[str, set[int]],
                 keep_io_types: bool, to_float16: Callable[[np.ndarray], np.ndarray]) -> None:
        self.graph = graph
        self.gate_of = gate_of
        self.float32_inputs = float32_inputs
        self.keep_io_types = keep_io_types
        self.to_float16 = to_float16
        self.types = scope_types(graph)
        self.inputs = {value.name for value in graph.input}
        self.initializers = {init.name: init for init in graph.initializer}
        self.producers = {out: node for node in graph.node for out in node.output if out}
        self.added: list[onnx.NodeProto] = []
        self.gate_names: dict[int, str] = {}
        self.rounded: dict[str, str] = {}
        self.producer_side: dict[str, str] = {}
        self.reader_side: dict[tuple[str, int], str] = {}

    def build(self) -> None:
        outputs = self._detach_outputs()
        for node in list(self.graph.node):
            for index, name in enumerate(node.input):
                if name and self.types.get(name) == FLOAT:
                    node.input[index] = self._seen_by(name, node, index)
        from onnx import helper

        for name, raw in outputs.items():
            value = self._producer_value(raw) if self.keep_io_types else self._round(raw)
            self.added.append(helper.make_node("Identity", [value], [name], name=f"{name}__out"))
        self.graph.node.extend(self.added)

    def _detach_outputs(self) -> dict[str, str]:
        """Float outputs made by nodes are renamed `<name>__raw` so the emulated value can take the name."""
        renamed = {}
        for value in self.graph.output:
            producer = self.producers.get(value.name)
            if producer is None or self.types.get(value.name) != FLOAT:
                continue
            raw = f"{value.name}__raw"
            producer.output[:] = [raw if out == value.name else out for out in producer.output]
            rename_uses(self.graph, value.name, raw, outputs=False)
            self.types[raw] = FLOAT
            self.producers[raw] = producer
            renamed[value.name] = raw
        return renamed

    def _gate(self, index: int) -> str:
        import numpy as np
        from onnx import helper, numpy_helper

        if index not in self.gate_names:
            name = f"__fp16_gate_{index}"
            self.graph.initializer.append(numpy_helper.from_array(np.array(index, np.int64), f"{name}_index"))
            self.added.append(helper.make_node("Gather", [GATES_INPUT, f"{name}_index"], [name], name=name))
            self.gate_names[index] = name
        return self.gate_names[index]

    def _switch(self, gate_index: int, name: str, otherwise: str, value: str) -> onnx.NodeProto:
        """``value``: ``name`` rounded to float16 when the gate is on, else ``otherwise``.  An If, not a Where of
        both: the rounding runs only where a trial turns it on (PP-OCRv4 det's twin ran 8x slower with Where,
        whose broadcast of a scalar condition was 65% of its time)."""
        from onnx import helper

        if name in self.initializers:
            rounded = [helper.make_node("Identity", [self._round(name)], [f"{value}__on"], name=f"{value}__on")]
        else:
            rounded = _round_nodes(name, f"{value}__on")
        branches = {
            branch: helper.make_graph(nodes, f"{value}__{branch}", [],
                                      [helper.make_tensor_value_info(nodes[-1].output[0], FLOAT, None)])
            for branch, nodes in (
                ("then_branch", rounded),
                ("else_branch", [helper.make_node("Identity", [otherwise], [f"{value}__off"], name=f"{value}__off")]))}
        return helper.make_node("If", [self._gate(gate_index)], [value], name=value, **branches)

    def _round(self, name: str) -> str:
        """The float16-rounded value of a tensor (initializers rounded ahead, clamped like the converter does)."""
        from onnx import numpy_helper

        if name not in self.rounded:
            target = f"{name}__r16"
            if name in self.initializers:
                values = self.to_float16(numpy_helper.to_array(self.initializers[name])).astype("float32")
                self.graph.initializer.append(numpy_helper.from_array(values, target))
            else:
                self.added.extend(_round_nodes(name, target))
            self.rounded[name] = target
        return self.rounded[name]

    def _producer_value(self, name: str) -> str:
        """The tensor as its producer leaves it: rounded when the producer runs in float16."""

        if name not in self.producer_side:
            producer = self.producers.get(name)
            if name in self.inputs and not self.keep_io_types:
                value = self._round(name)
            elif producer is not None and producer.name in self.gate_of:
                value = f"{name}__p16"
                self.added.append(self._switch(self.gate_of[producer.name], name, name, value))
            else:
                value = name
            self.producer_side[name] = value
        return self.producer_side[name]

    def _seen_by(self, name: str, node: onnx.NodeProto, index: int) -> str:
        produced = self._producer_value(name)
        if node.name not in self.gate_of or index in self.float32_inputs.get(node.name, set()):
            return produced
        gate_index = self.gate_of[node.name]
        key = (name, gate_index)
        if key not in self.reader_side:
            value = f"{name}__g{gate_index}"
            self.added.append(self._switch(gate_index, name, produced, value))
            self.reader_side[key] = value
        return self.reader_side[key]

