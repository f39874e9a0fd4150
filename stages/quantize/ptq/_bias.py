"""Gemm biases in the one form ONNX Runtime's quantizer handles: a 1-D vector of N values.

ONNX allows Gemm's C to be anything that broadcasts to [M, N]: a scalar, [1],
[N], [1, N], [M, 1], [M, N].  tf2onnx and ORT's own pre-processing (MatMul +
Add fused into Gemm) write [1, N].  ORT's QDQ quantizer treats C as an int32
bias of one value per output channel and indexes it as 1-D: with per-channel
weights a [1, N] bias makes ``bias[i]`` a row and the quantizer crashes with
numpy's "truth value of an array ... is ambiguous"; a scalar one fails on
``bias[1]``.  So, before quantizing:

- a C that only varies along N (or not at all) becomes the equal 1-D [N]
  vector (beta folded in), which is exact;
- a C that varies along M is moved out of the Gemm into an Add after it (beta
  folded in), also exact: the Gemm is quantized, the Add stays float.

Edits protobuf directly: it prepares the message handed to ORT's quantizer, which works on protobuf.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import numpy as np

from qdeploy.graph.names import node_names
from qdeploy.graph.utils import delete_where, fresh_name, names_read

if TYPE_CHECKING:
    import onnx

log = logging.getLogger(__name__)


def vector_gemm_biases(model: onnx.ModelProto) -> dict[str, int]:
    """Rewrite every Gemm whose constant C is not a 1-D [N] vector (see the module doc); counts per rewrite."""
    graph = model.graph
    initializers = {init.name: init for init in graph.initializer}
    taken = {name for node in graph.node for name in node.output} | set(initializers) | node_names(graph)
    counts = {"gemm_bias_vectorized": 0, "gemm_bias_moved_to_add": 0}
    nodes: list[onnx.NodeProto] = []
    replaced: set[str] = set()
    for node in graph.node:
        nodes.append(node)
        rewritten = _rewrite_gemm(graph, node, initializers, taken)
        if rewritten is None:
            continue
        replaced.add(rewritten[0])
        if rewritten[1] is None:
            counts["gemm_bias_vectorized"] += 1
        else:
            nodes.append(rewritten[1])
            counts["gemm_bias_moved_to_add"] += 1
    if counts["gemm_bias_moved_to_add"]:
        del graph.node[:]
        graph.node.extend(nodes)
    _drop_unread(model, replaced)
    if any(counts.values()):
        log.info("Gemm biases rewritten for the quantizer: %s", counts)
    return {key: value for key, value in counts.items() if value}


def _rewrite_gemm(graph: onnx.GraphProto, node: onnx.NodeProto, initializers: dict[str, onnx.TensorProto],
                  taken: set[str]) -> tuple[str, onnx.NodeProto | None] | None:
    """(the old bias name, the Add now holding the bias or None) when the Gemm was rewritten; None when not."""
    from onnx import numpy_helper

    if node.op_type != "Gemm" or node.domain not in ("", "ai.onnx") or len(node.input) < 3 or not node.input[2]:
        return None
    bias, weight = initializers.get(node.input[2]), initializers.get(node.input[1])
    if bias is None or weight is None or len(weight.dims) != 2:
        return None
    columns = weight.dims[0] if _attribute(node, "transB", 0) else weight.dims[1]
    values = numpy_helper.to_array(bias)
    beta = float(_attribute(node, "beta", 1.0))
    if values.shape == (columns,) and beta == 1.0:
        return None
    vector = _as_vector(values, columns)
    scaled = (vector if vector is not None else values) * np.asarray(beta, dtype=values.dtype)
    old = node.input[2]
    name = fresh_name(f"{old}_{'vector' if vector is not None else 'added'}", taken)
    graph.initializer.append(numpy_helper.from_array(scaled.astype(values.dtype), name))
    initializers[name] = graph.initializer[-1]
    _set_beta_one(node)
    if vector is not None:
        node.input[2] = name
        return old, None
    return old, _move_bias_to_add(node, name, taken)


def _as_vector(values: np.ndarray, columns: int) -> np.ndarray | None:
    """The [N] vector equal to C when C does not vary along M (shape [], [1], [N], [1, N], [1, 1]); else None."""
    if values.ndim > 2 or (values.ndim == 2 and values.shape[0] != 1) or values.size not in (1, columns):
        return None
    return np.broadcast_to(values.reshape(-1), (columns,)).copy()


def _move_bias_to_add(node: onnx.NodeProto, bias: str, taken: set[str]) -> onnx.NodeProto:
    """Gemm(A, B, C) -> Add(Gemm(A, B), C); returns the Add, which goes right after the Gemm."""
    from onnx import helper

    product = fresh_name(f"{node.output[0]}_product", taken)
    add = helper.make_node("Add", [product, bias], [node.output[0]], name=fresh_name(f"{node.name}_bias", taken))
    del node.input[2]
    node.output[0] = product
    return add


def _set_beta_one(node: onnx.NodeProto) -> None:
    for attribute in list(node.attribute):
        if attribute.name == "beta":
            node.attribute.remove(attribute)


def _attribute(node: onnx.NodeProto, name: str, default: float) -> float:
    from onnx import helper

    found = next((attr for attr in node.attribute if attr.name == name), None)
    return helper.get_attribute_value(found) if found is not None else default


def _drop_unread(model: onnx.ModelProto, names: set[str]) -> None:
    """The replaced biases no graph reads any more (subgraphs may read outer initializers too)."""
    dead = names - names_read(list(model.graph.node), model.graph) if names else set()
    if dead:
        delete_where(model.graph.initializer, lambda init: init.name in dead)
