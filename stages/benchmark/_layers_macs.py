"""Multiply-accumulates of the compute nodes (Conv, ConvTranspose, MatMul, Gemm), from the tensor shapes one
reference inference saw: what share of the model's arithmetic ran in each precision."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["COMPUTE_OPS", "node_macs"]

COMPUTE_OPS = frozenset({"Conv", "ConvTranspose", "MatMul", "Gemm"})


def node_macs(model: Any, shapes: Mapping[str, Sequence[int]]) -> dict[str, int]:
    """Node name -> multiply-accumulates of one inference, for the compute nodes whose shapes are known."""
    known: dict[str, list[int]] = {name: list(shape) for name, shape in shapes.items()}
    for tensor in model.graph.initializer:
        known.setdefault(tensor.name, list(tensor.dims))
    for node in model.graph.node:
        if node.op_type == "Constant":
            for attribute in node.attribute:
                if attribute.name == "value":
                    known.setdefault(node.output[0], list(attribute.t.dims))
    macs = {}
    for node in model.graph.node:
        if node.op_type not in COMPUTE_OPS or not node.output or node.output[0] not in known:
            continue
        count = _macs(node, known)
        if count is not None:
            macs[node.name] = count
    return macs


def _macs(node: Any, known: dict[str, list[int]]) -> int | None:
    out = known[node.output[0]]
    first = known.get(node.input[0]) if node.input else None
    weight = known.get(node.input[1]) if len(node.input) > 1 else None
    if node.op_type == "Conv" and weight and len(weight) >= 2:
        return math.prod(out) * math.prod(weight[1:])
    if node.op_type == "ConvTranspose" and weight and first and len(weight) >= 2:
        return math.prod(first) * math.prod(weight[1:])
    if node.op_type == "MatMul" and first:
        return math.prod(out) * first[-1]
    if node.op_type == "Gemm" and first and len(first) == 2:
        trans_a = next((a.i for a in node.attribute if a.name == "transA"), 0)
        return math.prod(out) * first[0 if trans_a else 1]
    return None
