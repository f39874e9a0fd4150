"""LSTMs with peephole weights written out as Scans, for OpenVINO: its ONNX frontend drops the peepholes.

OpenVINO 2026.4 reads an ONNX LSTM whose P input is not zero and computes it without the peephole terms, with no
error or warning: madmom's beat tracker (BLSTM layers with peepholes) read cosine 0.25 against ONNX Runtime in
float32 pinned to f32, and a 7-step LSTM with random peepholes differs by 0.04 where, P zeroed, it matches to 6e-8.
Like ``qdeploy.graph.loop_carried``, the OpenVINO adapter applies this to the copy it hands OpenVINO
(``qdeploy.targets.openvino_read``); the artifact keeps its LSTM, which ONNX Runtime computes right.

Each direction becomes ONNX's recurrence written out: ``X Wᵀ + Wb + Rb`` for every step at once, then a Scan
whose body adds ``H Rᵀ`` and the peepholes (``i = σ(.. + Pi ⊙ C)``, ``f = σ(.. + Pf ⊙ C)``, ``C' = f ⊙ C + i ⊙
tanh(..)``, ``o = σ(.. + Po ⊙ C')``, ``H' = o ⊙ tanh(C')``), a reverse direction scanned backwards with its outputs
kept in time order.  Only an LSTM this writes exactly is rewritten: W, R, B and P initializers held in the file,
the default activations, no clip, no input_forget, layout 0 and no sequence_lens.

Edits protobuf directly: the model may be a graph without its weights.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from qdeploy.graph.names import NodeNames
from qdeploy.graph.utils import default_opset, node_attributes
from qdeploy.graph.writer import GraphWriter

if TYPE_CHECKING:
    import onnx

__all__ = ["write_out_peephole_lstms"]

_DEFAULT_ACTIVATIONS = ("Sigmoid", "Tanh", "Tanh")
_EXTERNAL = 1  # TensorProto.EXTERNAL


def write_out_peephole_lstms(model: onnx.ModelProto) -> list[str]:
    """Replace, in the main graph, each LSTM with non-zero peepholes that can be written exactly by Scans; the names
    of the LSTMs so rewritten."""
    from onnx import helper

    graph = model.graph
    if not any(node.op_type == "LSTM" and len(node.input) > 7 and node.input[7] for node in graph.node):
        return []
    weights = {init.name: init for init in graph.initializer}
    taken = {name for node in graph.node for name in (*node.input, *node.output)} | set(weights)
    taken |= {value.name for value in (*graph.input, *graph.output)}
    names, rewritten, nodes = NodeNames.of(graph), [], []
    opset = default_opset(model)
    for node in graph.node:
        arrays = _weights(node, weights)
        if arrays is None:
            nodes.append(node)
            continue
        writer = _Writer(graph, names, taken, node, helper.np_dtype_to_tensor_dtype(arrays[0].dtype), opset)
        nodes.extend(writer.lstm(*arrays))
        rewritten.append(node.name or node.output[0])
    if rewritten:
        del graph.node[:]
        graph.node.extend(nodes)
    return rewritten


def _weights(node: onnx.NodeProto, weights: dict[str, onnx.TensorProto]) -> tuple[np.ndarray, ...] | None:
    """(W, R, B, P) of an LSTM this module rewrites exactly, or None."""
    from onnx import numpy_helper

    if node.op_type != "LSTM" or node.domain not in ("", "ai.onnx") or len(node.input) < 8 or not node.input[7]:
        return None
    attributes = node_attributes(node)
    activations = tuple(item.decode() for item in attributes.get("activations", []))
    if (attributes.get("clip") is not None or attributes.get("input_forget", 0) or attributes.get("layout", 0)
            or activations not in ((), _DEFAULT_ACTIVATIONS, _DEFAULT_ACTIVATIONS * 2)
            or (len(node.input) > 4 and node.input[4])):
        return None
    held = [weights.get(name) for name in (node.input[1], node.input[2], node.input[3] if len(node.input) > 3
                                           else "", node.input[7])]
    if held[0] is None or held[1] is None or held[3] is None or any(
            tensor is not None and tensor.data_location == _EXTERNAL for tensor in held):
        return None
    w, r, p = (numpy_helper.to_array(held[index]) for index in (0, 1, 3))
    if not p.any():
        return None  # without peepholes OpenVINO's LSTM is right
    b = numpy_helper.to_array(held[2]) if held[2] is not None else np.zeros((w.shape[0], 2 * w.shape[1]), w.dtype)
    return w, r, b, p


class _Writer(GraphWriter):
    """The nodes and initializers that compute one LSTM node, added to ``graph`` under fresh names."""

    def __init__(self, graph: onnx.GraphProto, names: NodeNames, taken: set[str], node: onnx.NodeProto,
                 element: int, opset: int) -> None:
        super().__init__(graph, node, taken)
        self.names, self.element, self.opset = names, element, opset

    def add(self, op_type: str, inputs: list[str], suffix: str, outputs: int = 1, **attributes: object) -> list[str]:
        from onnx import helper

        produced = [self.fresh(f"{suffix}_{index}" if outputs > 1 else suffix) for index in range(outputs)]
        self.nodes.append(helper.make_node(op_type, inputs, produced, name=self.names.fresh(f"{self.base}/{suffix}"),
                                           **attributes))
        return produced

    def lstm(self, w: np.ndarray, r: np.ndarray, b: np.ndarray, p: np.ndarray) -> list[onnx.NodeProto]:
        hidden = r.shape[-1]
        reverse = [False] if w.shape[0] == 1 else [False, True]
        direction = next((attr.s.decode() for attr in self.node.attribute if attr.name == "direction"), "forward")
        if direction == "reverse":
            reverse = [True]
        initial = [self.node.input[index] if len(self.node.input) > index else "" for index in (5, 6)]
        sequences, finals_h, finals_c = [], [], []
        for d, backwards in enumerate(reverse):
            y, h, c = self.direction(d, backwards, w[d], r[d], b[d], p[d], hidden, initial)
            sequences.append(self.unsqueeze(y, 1, f"y{d}"))
            finals_h.append(self.unsqueeze(h, 0, f"h{d}"))
            finals_c.append(self.unsqueeze(c, 0, f"c{d}"))
        for slot, parts, axis in ((0, sequences, 1), (1, finals_h, 0), (2, finals_c, 0)):
            if len(self.node.output) > slot and self.node.output[slot]:
                self.nodes.append(_concat_into(parts, self.node.output[slot], axis, self.names.fresh(self.base)))
        return self.nodes

    def direction(self, d: int, backwards: bool, w: np.ndarray, r: np.ndarray, b: np.ndarray, p: np.ndarray,
                  hidden: int, initial: list[str]) -> tuple[str, str, str]:
        """One direction's Scan: (Y [seq, batch, H], final H, final C)."""
        x = self.node.input[0]
        gates_x = self.add("MatMul", [x, self.constant(f"wt{d}", w.T)], f"xw{d}")[0]
        gates_x = self.add("Add", [gates_x, self.constant(f"bias{d}", b[:4 * hidden] + b[4 * hidden:])], f"xwb{d}")[0]
        states = [self.initial_state(initial[index], d, x, hidden, kind) for index, kind in enumerate("hc")]
        body = _cell_body(self.element, r.T, p, hidden, self.fresh(f"cell{d}"), self.opset)
        outs = self.add("Scan", [*states, gates_x], f"scan{d}", outputs=3, body=body, num_scan_inputs=1,
                        scan_input_directions=[int(backwards)], scan_output_directions=[int(backwards)])
        return outs[2], outs[0], outs[1]

    def unsqueeze(self, value: str, axis: int, suffix: str) -> str:
        if self.opset >= 13:
            return self.add("Unsqueeze", [value, self.constant(f"{suffix}_axes", np.array([axis]))], suffix)[0]
        return self.add("Unsqueeze", [value], suffix, axes=[axis])[0]

    def initial_state(self, given: str, d: int, x: str, hidden: int, kind: str) -> str:
        """The direction's initial H or C [batch, H]: the input's slice, or zeros of X's batch."""
        from onnx import helper

        if given:
            return self.add("Gather", [given, self.constant(f"dir_{kind}{d}", np.array(d))], f"{kind}0_{d}",
                            axis=0)[0]
        shape = self.add("Shape", [x], f"shape_{kind}{d}")[0]
        batch = self.add("Gather", [shape, self.constant(f"batch_axis_{kind}{d}", np.array([1]))], f"batch_{kind}{d}",
                         axis=0)[0]
        size = self.add("Concat", [batch, self.constant(f"hidden_{kind}{d}", np.array([hidden]))], f"size_{kind}{d}",
                        axis=0)[0]
        zero = helper.make_tensor("zero", self.element, [1], [0.0])
        return self.add("ConstantOfShape", [size], f"zeros_{kind}{d}", value=zero)[0]


def _concat_into(parts: list[str], output: str, axis: int, name: str) -> onnx.NodeProto:
    from onnx import helper

    if len(parts) == 1:
        return helper.make_node("Identity", parts, [output], name=name)
    return helper.make_node("Concat", parts, [output], name=name, axis=axis)


def _cell_body(element: int, r_t: np.ndarray, p: np.ndarray, hidden: int, name: str, opset: int) -> onnx.GraphProto:
    """One step: (H, C, gates from X) -> (H', C', H'), ONNX's LSTM equations with gate order i, o, f, c; every name
    prefixed with ``name`` (no shadowing of the outer graph's)."""
    from onnx import helper, numpy_helper

    def n(local: str) -> str:
        return f"{name}/{local}"

    def node(op_type: str, inputs: list[str], outputs: list[str], **attributes: object) -> onnx.NodeProto:
        return helper.make_node(op_type, [n(item) for item in inputs], [n(item) for item in outputs], name=n(op_type
                                + "_" + outputs[0]), **attributes)

    dtype = helper.tensor_dtype_to_np_dtype(element)
    constants = [numpy_helper.from_array(np.ascontiguousarray(r_t.astype(dtype)), n("rt")),
                 *(numpy_helper.from_array(p[index * hidden:(index + 1) * hidden].astype(dtype), n(f"p{gate}"))
                   for index, gate in enumerate("iof"))]
    split = {"num_outputs": 4} if opset >= 18 else {}
    nodes = [node("MatMul", ["h", "rt"], ["hr"]), node("Add", ["xw", "hr"], ["gates"]),
             node("Split", ["gates"], ["gi", "go", "gf", "gc"], axis=1, **split),
             node("Mul", ["pi", "c"], ["ci"]), node("Add", ["gi", "ci"], ["ai"]), node("Sigmoid", ["ai"], ["i"]),
             node("Mul", ["pf", "c"], ["cf"]), node("Add", ["gf", "cf"], ["af"]), node("Sigmoid", ["af"], ["f"]),
             node("Tanh", ["gc"], ["candidate"]), node("Mul", ["f", "c"], ["kept"]),
             node("Mul", ["i", "candidate"], ["new"]), node("Add", ["kept", "new"], ["c_next"]),
             node("Mul", ["po", "c_next"], ["co"]), node("Add", ["go", "co"], ["ao"]), node("Sigmoid", ["ao"], ["o"]),
             node("Tanh", ["c_next"], ["squashed"]), node("Mul", ["o", "squashed"], ["h_next"]),
             node("Identity", ["h_next"], ["y"])]
    widths = {"h": hidden, "c": hidden, "xw": 4 * hidden, "h_next": hidden, "c_next": hidden, "y": hidden}
    inputs, outputs = ([helper.make_tensor_value_info(n(item), element, [None, widths[item]]) for item in items]
                       for items in (("h", "c", "xw"), ("h_next", "c_next", "y")))
    return helper.make_graph(nodes, name, inputs, outputs, constants)
