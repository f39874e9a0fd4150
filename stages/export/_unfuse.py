"""ONNX Runtime's own fused ops written back as the standard ops they fuse.

A model that ONNX Runtime optimized and saved at ORT_ENABLE_EXTENDED holds ``com.microsoft`` FusedConv, FusedGemm
and FusedMatMul: a Conv or Gemm with its activation (and a residual Add) in one node, a MatMul with a scale.
ONNX Runtime runs them, but its quantizer and NNCF do not know them (a FusedConv's input stayed float, the model
came out "weight-only"), and the fp16 stage has no float16 kernel for them.  Written out again they are the
standard ops ONNX Runtime fused, computing the same function; it fuses them again when it loads the artifact.
A form this module does not cover (FusedMatMul with batch transposes, an unknown activation) stays as it is.
"""

from __future__ import annotations

import logging
from collections import Counter
from typing import TYPE_CHECKING

from qdeploy.graph.utils import node_attributes, subgraphs

if TYPE_CHECKING:
    import onnx

    from qdeploy.stages.export.findings import ExportRecord

__all__ = ["unfuse_runtime_ops"]

log = logging.getLogger(__name__)

_MS = "com.microsoft"
_CONV_ATTRIBUTES = ("auto_pad", "dilations", "group", "kernel_shape", "pads", "strides")
_GEMM_ATTRIBUTES = ("alpha", "beta", "transA", "transB")


def unfuse_runtime_ops(model: onnx.ModelProto, findings: ExportRecord) -> None:
    """FusedConv, FusedGemm and FusedMatMul (com.microsoft) in every graph replaced by the standard ops they fuse."""
    done: Counter[str] = Counter()
    _unfuse_graph(model.graph, done)
    if done:
        findings["runtime_fusions_undone"] = dict(done)
        log.info("ONNX Runtime's fused ops written as standard ops: %s",
                 ", ".join(f"{op} {count}" for op, count in sorted(done.items())))


def _unfuse_graph(graph: onnx.GraphProto, done: Counter[str]) -> None:
    for node in graph.node:  # bodies first: rebuilding this graph's node list copies them
        for body in subgraphs(node):
            _unfuse_graph(body, done)
    nodes: list[onnx.NodeProto] = []
    changed = False
    for node in graph.node:
        written = _standard_form(node, graph) if node.domain == _MS else None
        if written is None:
            nodes.append(node)
            continue
        nodes.extend(written)
        done[node.op_type] += 1
        changed = True
    if changed:
        del graph.node[:]
        graph.node.extend(nodes)


def _standard_form(node: onnx.NodeProto, graph: onnx.GraphProto) -> list[onnx.NodeProto] | None:
    from onnx import helper

    attributes = node_attributes(node)
    activation = attributes.get("activation", b"")
    activation = activation.decode() if isinstance(activation, bytes) else str(activation)
    output, base = node.output[0], node.name or node.output[0]
    if node.op_type == "FusedConv" and len(node.input) <= 4:
        params = list(attributes.get("activation_params", []))
        tail = _activation(activation, params, output, base, graph)
        if tail is None:
            return None
        conv_out = f"{output}__conv" if tail or len(node.input) == 4 else output
        kept = {name: value for name, value in attributes.items() if name in _CONV_ATTRIBUTES}
        conv_inputs = list(node.input[:3])
        while conv_inputs and not conv_inputs[-1]:  # an absent bias before a present Z
            conv_inputs.pop()
        written = [helper.make_node("Conv", conv_inputs, [conv_out], name=base, **kept)]
        summed = conv_out
        if len(node.input) == 4 and node.input[3]:  # Z: added before the activation
            summed = f"{output}__sum" if tail else output
            written.append(helper.make_node("Add", [conv_out, node.input[3]], [summed], name=f"{base}/add"))
        return written + _fed(tail, summed)
    if node.op_type == "FusedGemm":
        params = [attributes[key] for key in ("activation_alpha", "activation_beta", "activation_gamma")
                  if key in attributes]
        tail = _activation(activation, params, output, base, graph)
        if tail is None:
            return None
        kept = {name: value for name, value in attributes.items() if name in _GEMM_ATTRIBUTES}
        gemm_out = f"{output}__gemm" if tail else output
        return [helper.make_node("Gemm", list(node.input), [gemm_out], name=base, **kept), *_fed(tail, gemm_out)]
    if node.op_type == "FusedMatMul" and not any(attributes.get(key) for key in
                                                   ("transA", "transB", "transBatchA", "transBatchB")):
        alpha = float(attributes.get("alpha", 1.0))
        if alpha == 1.0:
            return [helper.make_node("MatMul", list(node.input), [output], name=base)]
        scale = _scalar(graph, f"{base}/alpha", alpha)
        return [helper.make_node("MatMul", list(node.input), [f"{output}__matmul"], name=base),
                helper.make_node("Mul", [f"{output}__matmul", scale], [output], name=f"{base}/scale")]
    return None


def _activation(kind: str, params: list[float], output: str, base: str,
                graph: onnx.GraphProto) -> list[onnx.NodeProto] | None:
    """The activation node writing ``output`` (its input left empty for ``_fed``); [] for none, None when
    unknown."""
    from onnx import helper

    name = f"{base}/{kind.lower()}"
    if kind == "":
        return []
    if kind in ("Relu", "Sigmoid", "Tanh"):
        return [helper.make_node(kind, [""], [output], name=name)]
    if kind == "LeakyRelu":
        return [helper.make_node(kind, [""], [output], name=name, alpha=params[0] if params else 0.01)]
    if kind == "HardSigmoid" and len(params) >= 2:
        return [helper.make_node(kind, [""], [output], name=name, alpha=params[0], beta=params[1])]
    if kind == "Clip" and len(params) >= 2:
        low, high = _scalar(graph, f"{name}/min", params[0]), _scalar(graph, f"{name}/max", params[1])
        return [helper.make_node(kind, ["", low, high], [output], name=name)]
    return None


def _fed(tail: list[onnx.NodeProto], source: str) -> list[onnx.NodeProto]:
    for node in tail:
        node.input[0] = source
    return tail


def _scalar(graph: onnx.GraphProto, name: str, value: float) -> str:
    import numpy as np
    from onnx import numpy_helper

    graph.initializer.append(numpy_helper.from_array(np.array(value, np.float32), name))
    return name
