"""Lowering rule for QuantizeLinear nodes applied to float weights: fold them into integer initializers.

A QAT export often keeps ``QuantizeLinear(W_float) -> DequantizeLinear`` on every
weight; runtimes then quantize the weight again at each load.  The rule computes
QuantizeLinear now (ONNX semantics: round half to even, saturate) and leaves the
integer weight feeding the DequantizeLinear.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from qdeploy.graph.edit import AI_ONNX_DOMAINS, constant_array
from qdeploy.stages.quantize.lower._base import (
    LoweringEditor,
    Match,
    Rule,
    SiteRecord,
    missing_constants,
)
from qdeploy.stages.quantize.lower._reference import quantize_linear

if TYPE_CHECKING:
    import onnx_ir as ir

_FLOAT_KINDS = "f"


def weight_qdq_pattern(node: ir.Node) -> Match | None:
    if node.op_type != "QuantizeLinear" or node.domain not in AI_ONNX_DOMAINS or node.inputs[0] is None:
        return None
    weight = constant_array(node.inputs[0])
    if weight is None or weight.dtype.kind not in _FLOAT_KINDS:
        return None
    zero = constant_array(node.inputs[2]) if len(node.inputs) > 2 and node.inputs[2] is not None else \
        np.zeros((), np.uint8)
    axis = node.attributes.get("axis")
    return Match([node], node.inputs[0], node.outputs[0],
                 {"weight": weight, "scale": constant_array(node.inputs[1]), "zero_point": zero},
                 {"axis": axis.value if axis is not None else 1, "block_size": node.attributes.get("block_size")})


def weight_qdq_check(match: Match) -> str | None:
    refusal = missing_constants(match, ("scale", "zero_point"))
    if refusal:
        return refusal
    if match.attributes["block_size"] is not None:
        return "blocked quantization (block_size) is left as it is"
    if match.y.is_graph_output():
        return "the quantized weight is a graph output"
    if np.any(np.asarray(match.constants["scale"]) <= 0):
        return "non-positive scale"
    return None


def weight_qdq_replacement(match: Match, editor: LoweringEditor) -> SiteRecord:
    weight, scale, zero = (np.asarray(match.constants[name]) for name in ("weight", "scale", "zero_point"))
    axis = match.attributes["axis"] % max(weight.ndim, 1)
    shape = [-1 if index == axis else 1 for index in range(weight.ndim)]
    laid_scale = scale.reshape(shape) if scale.size > 1 else scale
    laid_zero = zero.reshape(shape) if zero.size > 1 else zero
    data = quantize_linear(weight, laid_scale, laid_zero, zero.dtype)
    folded = editor.initializer(f"{match.x.name or 'weight'}_quantized", data)
    match.y.replace_all_uses_with(folded)
    editor.graph.remove(match.nodes, safe=True)
    steps = np.abs(weight.astype(np.float64) - (data.astype(np.float64) - laid_zero) * laid_scale)
    return {"rule": "fold_weight_quantize_linear", "nodes": match.names, "tensor": match.x.name, "kind": "weight",
            "dtype": str(zero.dtype), "per_channel": bool(scale.size > 1), "exact": True, "max_difference": 0.0,
            "step": float(np.max(scale)), "rounding_error_steps": float(np.max(steps / laid_scale, initial=0.0))}


RULES = (Rule("fold_weight_quantize_linear", weight_qdq_pattern, weight_qdq_replacement, weight_qdq_check),)
