"""The product of a float16 Conv or Gemm is rounded to float16 before its bias is added: the emulation does so too.

Float16 arithmetic without a fused bias (onnx's reference evaluator, ``reference:cpu``; kernels that add the
bias in a second pass) computes ``round(round(W * x) + B)``. When the bias cancels much of the product (a
BatchNormalization folded into the Conv leaves a bias of the product's size and opposite sign), the first
rounding, on the larger value, dominates the error. The emulation used to round once, after the bias, and so
promised more than true float16 gave: on PP-OCRv4 det fed noise (192x192), the first rounding makes a Conv's
error up to 2.5x (median 1.4x) the output rounding alone; over 9 draws the emulated output SNR was 6.5 dB
from the reference evaluator's on average (2.4 dB too optimistic), 3.4 dB with the bias split as below. A
Gemm whose bias cancels its product (tests/stages/fp16/test_fp16_headroom.py) emulated at 74.5 dB where true
float16 gives 22.8; split, both say 22.8.

Both twins split such a node into the product (the node itself, without its bias), a Reshape of the bias for
broadcasting, and an Add; the product is then rounded like any float16 tensor (in the gated twin, under the
node's own gate).

Edits protobuf directly, not through ``qdeploy.graph.edit``: it is one step of the twin builders
(``_emulate``), on their protobuf copy, graph by graph (subgraphs too); a session per graph would read and write
back each graph around a few nodes.  It keeps a rule's shape all the same: the pattern and check are
``_weight_rank`` (a Conv or Gemm with a bias of known broadcast rank), the rewrite is the loop's body.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from qdeploy.graph.names import NodeNames

if TYPE_CHECKING:
    import onnx

__all__ = ["split_biases"]

BIASED_OPS = frozenset({"Conv", "Gemm"})
PRODUCT_SUFFIX = "__fp16_product"


def split_biases(graph: onnx.GraphProto, types: dict[str, int], elem_type: int,
                 names: set[str] | None = None) -> dict[str, str]:
    """Split each Conv/Gemm with a bias whose output has ``elem_type`` (and whose name is in ``names``, when
    given) into product, bias Reshape and Add; ``types`` learns the new tensors. Returns {Add node: node}."""
    from onnx import helper, numpy_helper

    ranks = _known_ranks(graph)
    node_names = NodeNames.of(graph)  # a nameless node's Add would otherwise be "__fp16_bias_add" every time
    added: dict[str, str] = {}
    rewritten: list[onnx.NodeProto] = []
    for node in graph.node:
        rank = _weight_rank(node, ranks)
        if rank is None or types.get(node.output[0]) != elem_type or (names is not None and node.name not in names):
            rewritten.append(node)
            continue
        out, bias = node.output[0], node.input[2]
        product, shaped, shape = f"{out}{PRODUCT_SUFFIX}", f"{out}__fp16_bias", f"{out}__fp16_bias_shape"
        dims = [-1] + [1] * (rank - 2) if node.op_type == "Conv" else [1, -1]
        graph.initializer.append(numpy_helper.from_array(_int64(dims), shape))
        if node.op_type == "Gemm":  # C is required before opset 11 (tf2onnx's opset-9 exports): a zero, exact
            zero = f"{out}__fp16_no_bias"
            graph.initializer.append(helper.make_tensor(zero, elem_type, [], [0]))
            node.input[2] = zero
        else:
            del node.input[2]
        node.output[0] = product
        add = helper.make_node("Add", [product, shaped], [out],
                               name=node_names.derived(node.name, "__fp16_bias_add", node.op_type))
        reshape = helper.make_node("Reshape", [bias, shape], [shaped],
                                   name=node_names.derived(node.name, "__fp16_bias_reshape", node.op_type))
        rewritten.extend([node, reshape, add])
        for name in (product, shaped):
            types[name] = elem_type
            graph.value_info.append(helper.make_tensor_value_info(name, elem_type, None))
        added[add.name] = node.name
    del graph.node[:]
    graph.node.extend(rewritten)
    return added


def _weight_rank(node: onnx.NodeProto, ranks: dict[str, int]) -> int | None:
    """The rank that shapes the bias's broadcast, or None when the node is not split (no bias, Gemm's C
    not a plain per-column vector, beta != 1, unknown Conv weight rank)."""
    if node.op_type not in BIASED_OPS or node.domain not in ("", "ai.onnx") or len(node.input) < 3 \
            or not node.input[2]:
        return None
    attrs = {attr.name: attr for attr in node.attribute}
    if node.op_type == "Gemm":
        beta = attrs["beta"].f if "beta" in attrs else 1.0
        return 2 if beta == 1.0 and ranks.get(node.input[2]) == 1 else None
    return ranks.get(node.input[1])


def _known_ranks(graph: onnx.GraphProto) -> dict[str, int]:
    """Ranks of the tensors whose shapes the graph states: initializers, Constant values, value_info."""
    ranks = {init.name: len(init.dims) for init in graph.initializer}
    for node in graph.node:
        if node.op_type == "Constant" and node.output:
            for attr in node.attribute:
                if attr.name == "value" and attr.HasField("t"):
                    ranks[node.output[0]] = len(attr.t.dims)
    for value in (*graph.input, *graph.value_info):
        tensor = value.type.tensor_type
        if value.type.HasField("tensor_type") and tensor.HasField("shape") and value.name not in ranks:
            ranks[value.name] = len(tensor.shape.dim)
    return ranks


def _int64(values: list[int]) -> object:
    import numpy as np

    return np.asarray(values, dtype=np.int64)
