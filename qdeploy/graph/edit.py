"""The one way qdeploy edits a graph's structure: onnx-ir nodes and values, through ``GraphEditor``.

Graph rewrites (``qdeploy.graph.rewrites``) and fake-quant lowering (``qdeploy.stages.quantize.lower``) match
and replace nodes through this editor: producers and uses come from onnx-ir, a replacement rewires every use
(graph outputs included) and takes over the replaced value's name, and weights left unread go with the nodes
that read them.

Stages hold a ``onnx.ModelProto`` (ONNX Runtime, onnxoptimizer, onnxconverter-common and the checker take
protobuf), so ``editing(model)`` opens an edit session on a model and writes the edits back into the same
message.  It writes back only what changed: nodes that were not touched keep their protobuf message, and
initializers are added or deleted one by one.  A full ``ir.to_proto`` would copy every weight, which on a
2 GB model is 2 GB more resident memory for a rewrite of a few nodes.

Some modules still edit protobuf directly, and say why in their docstrings: constant folding swaps ONNX
Runtime's results into the message it ran, fp16 conversion is onnxconverter-common's protobuf walk and the fp16
repair and emulation twins rewrite nearly every node (a session would read and write back all of them), and the
weight passes (weight-only, SmoothQuant, clamping) rewrite initializers one tensor at a time to keep memory
bounded.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import numpy as np

from qdeploy.core.errors import ModelError
from qdeploy.graph.utils import delete_where, fresh_name, subgraphs

if TYPE_CHECKING:
    import onnx
    import onnx_ir as ir

__all__ = ["AI_ONNX_DOMAINS", "GraphEditor", "GraphNotEditable", "attribute", "constant_array", "editing",
           "write_back"]

AI_ONNX_DOMAINS = ("", "ai.onnx")
"""The two spellings of the default operator set's domain, ai.onnx (ai.onnx.ml is not in it)."""


def constant_array(value: ir.Value | None) -> np.ndarray | None:
    """The value's array when it is an initializer or a Constant node's output, else None."""
    import onnx_ir as ir

    if value is None:
        return None
    tensor = ir.convenience.get_const_tensor(value)
    return None if tensor is None else np.asarray(tensor.numpy())


def attribute(node: ir.Node, name: str, default: Any) -> Any:
    """A node attribute's value (strings decoded), or ``default`` when the node lacks it."""
    attr = node.attributes.get(name)
    if attr is None:
        return default
    value = attr.value
    return value.decode() if isinstance(value, bytes) else value


def _weight_tensor(value: ir.Value | None) -> ir.TensorProtocol | None:
    """The tensor of an initializer no graph input overrides (IR < 4 lets inputs replace initializers)."""
    if value is None or not value.is_initializer() or value.is_graph_input():
        return None
    return value.const_value


class GraphEditor:
    """Reads and edits of one onnx-ir graph: constants, fresh names, new initializers and nodes, replacement."""

    def __init__(self, graph: ir.Graph, opset: int = 0) -> None:
        import onnx_ir as ir

        self.graph = graph
        self.opset = opset
        self._names = {value.name for value in graph.initializers.values()}
        self._names |= {value.name for value in (*graph.inputs, *graph.outputs)}
        self._names |= {name for node in graph for name in (node.name, *(out.name for out in node.outputs))}
        # node names of nested graphs too: a new node repeats no node name anywhere (qdeploy.graph.names)
        self._names |= {node.name for node in ir.traversal.RecursiveGraphIterator(graph)}
        self._names.discard(None)

    # ----------------------------------------------------------------------------------------------- reading

    def constant(self, value: ir.Value | None) -> np.ndarray | None:
        """The value's array when it is an initializer or a Constant node's output."""
        return constant_array(value)

    def weight(self, value: ir.Value | None) -> np.ndarray | None:
        """The array of an initializer that no graph input can override; None for anything computed or fed."""
        tensor = _weight_tensor(value)
        return None if tensor is None else np.asarray(tensor.numpy())

    @staticmethod
    def weight_type(value: ir.Value | None) -> int | None:
        """The ONNX element type of a non-overridable initializer, or None."""
        tensor = _weight_tensor(value)
        return None if tensor is None else int(tensor.dtype)

    def sole_consumer(self, value: ir.Value) -> ir.Node | None:
        """The one node of this graph reading ``value``, when nothing else (graph output, subgraph) reads it."""
        uses = value.uses()
        if len(uses) != 1 or value.is_graph_output() or uses[0].node.graph is not self.graph:
            return None
        return uses[0].node

    # ----------------------------------------------------------------------------------------------- building

    def fresh_name(self, hint: str) -> str:
        """A tensor or node name used nowhere in the graph."""
        return fresh_name(hint, self._names)

    def initializer(self, hint: str, array: np.ndarray) -> ir.Value:
        """A new initializer holding ``array``, under a fresh name."""
        import onnx_ir as ir

        name = self.fresh_name(hint)
        value = ir.Value(name=name, shape=ir.Shape(array.shape), type=ir.TensorType(ir.DataType.from_numpy(
            array.dtype)), const_value=ir.tensor(array, name=name))
        self.graph.register_initializer(value)
        return value

    def node(self, op_type: str, inputs: list[ir.Value | None], name: str, *, outputs: int = 1,
             domain: str = "", **attributes: Any) -> ir.Node:
        """A new node (not yet in the graph) whose outputs carry fresh names derived from ``name``."""
        import onnx_ir as ir

        node = ir.node(op_type, inputs, attributes or None, domain=domain, num_outputs=outputs,
                       name=self.fresh_name(name))
        for index, out in enumerate(node.outputs):
            out.name = self.fresh_name(f"{name}_output" if outputs == 1 else f"{name}_output_{index}")
        return node

    # ----------------------------------------------------------------------------------------------- editing

    def replace(self, old_nodes: list[ir.Node], new_nodes: list[ir.Node], old_value: ir.Value,
                new_value: ir.Value) -> None:
        """Put ``new_nodes`` after the last of ``old_nodes``, which go; ``new_value`` takes over ``old_value``.

        Its uses, its graph-output place and its name move over, so readers see the same tensor name.  Weights
        that only the removed nodes read are deleted with them.
        """
        import onnx_ir as ir

        read = [value for node in old_nodes for value in node.inputs if value is not None]
        anchor = max(old_nodes, key=self.graph.index)
        ir.convenience.replace_nodes_and_values(self.graph, anchor, old_nodes, new_nodes, [old_value], [new_value])
        self._drop_unread(read)

    def _drop_unread(self, values: list[ir.Value]) -> None:
        for value in values:
            if value.is_initializer() and not value.uses() and not value.is_graph_input() \
                    and not value.is_graph_output() and value.name in self.graph.initializers:
                self.graph.initializers.pop(value.name)


# --------------------------------------------------------------------------------------------------------------
# Edit sessions on a ModelProto


@contextmanager
def editing(model: onnx.ModelProto, *, nested: bool = False) -> Iterator[GraphEditor]:
    """An editor on ``model``'s top-level graph; on leaving, the edits are written back into ``model``.

    Weights are not copied: onnx-ir's tensors read the message's own ``TensorProto``s.  On an exception
    nothing is written back.  ``nested``: the caller edits subgraphs too, so every top-level node holding one
    is written back whole (its bodies are copied; top-level weights still are not).
    """
    import onnx_ir as ir

    try:
        ir_model = ir.serde.deserialize_model(model)
    except ir.serde.SerdeError as exc:
        raise GraphNotEditable(_unrepresentable(model.graph) or _innermost(exc)) from None
    originals = _originals(ir_model.graph, model.graph)
    if nested:
        originals = {key: message for key, message in originals.items() if not subgraphs(message)}
    yield GraphEditor(ir_model.graph, ir_model.opset_imports.get("", 0))
    write_back(ir_model.graph, model.graph, originals, legacy_inputs=model.ir_version < 4)


class GraphNotEditable(ModelError):
    """onnx-ir, the editor's view of a graph, cannot hold this model (a map-typed value: scikit-learn's ZipMap
    probabilities, say); a pass that needs the view is skipped, and says why."""


def _unrepresentable(graph: onnx.GraphProto) -> str:
    """What onnx-ir cannot hold in this graph: the first value whose type holds a map, named; '' if none."""
    for value in (*graph.input, *graph.output, *graph.value_info):
        if _holds_map(value.type):
            return f"value '{value.name}' has a map type, which onnx-ir (the graph editor's view) cannot hold"
    return ""


def _holds_map(kind: onnx.TypeProto) -> bool:
    field = kind.WhichOneof("value")
    if field == "map_type":
        return True
    if field in ("sequence_type", "optional_type"):
        return _holds_map(getattr(kind, field).elem_type)
    return False


def _innermost(exc: BaseException) -> str:
    """The deepest cause's message, on one line: onnx-ir wraps each level of its reader in another SerdeError."""
    while exc.__cause__ is not None:
        exc = exc.__cause__
    return "onnx-ir (the graph editor's view) cannot read the model: " + " ".join(str(exc).split())[:300]


def _originals(graph: ir.Graph, proto: onnx.GraphProto) -> dict[int, onnx.NodeProto]:
    """Each ir node's source message (onnx-ir keeps the order of the nodes it reads)."""
    nodes = list(graph)
    if len(nodes) != len(proto.node) or any(a.op_type != b.op_type for a, b in zip(nodes, proto.node,
                                                                                 strict=True)):
        return {}
    return {id(node): message for node, message in zip(nodes, proto.node, strict=True)}


def write_back(graph: ir.Graph, proto: onnx.GraphProto, originals: dict[int, onnx.NodeProto], *,
               legacy_inputs: bool = False) -> None:
    """Make ``proto`` hold ``graph``'s nodes and initializers, reusing the messages of untouched nodes.

    ``legacy_inputs``: the model's IR is below 4, where every initializer must also be a graph input.
    """
    import onnx_ir as ir
    from onnx import helper

    outputs = [value.name for value in graph.outputs]
    if outputs != [value.name for value in proto.output]:
        raise ValueError(f"an edit renamed the graph outputs {[value.name for value in proto.output]} to {outputs}")
    nodes = []
    for node in graph:
        message = originals.get(id(node))
        nodes.append(message if message is not None and _unchanged(node, message) else ir.serde.serialize_node(node))
    del proto.node[:]
    proto.node.extend(nodes)
    kept = set(graph.initializers)
    present = {init.name for init in proto.initializer}
    if present - kept:
        delete_where(proto.initializer, lambda init: init.name not in kept)
    for name, value in graph.initializers.items():
        if name not in present and value.const_value is not None:
            tensor = proto.initializer.add()
            tensor.CopyFrom(ir.serde.serialize_tensor(value.const_value))
            if legacy_inputs:
                proto.input.append(helper.make_tensor_value_info(name, tensor.data_type, list(tensor.dims)))


def _unchanged(node: ir.Node, message: onnx.NodeProto) -> bool:
    def names(values: Any) -> list[str]:
        return [value.name if value is not None else "" for value in values]

    return names(node.inputs) == list(message.input) and names(node.outputs) == list(message.output)
