"""Lowering rule for fake quantization written out in plain ONNX ops.

    Div(x, s) | Mul(x, 1/s)  ->  [Add(zp)]  ->  Round  ->  [Add(zp)]  ->  Clip(qmin, qmax)  ->  [Sub(zp)]  ->  Mul(s)

The pattern is anchored on Round; every value inside it must feed only the next
node.  Scales may be per tensor or per channel (constants that broadcast along
one axis); zero points are added before or after rounding (the same thing for
integer zero points).
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING, TypedDict

import numpy as np

from qdeploy.graph.edit import AI_ONNX_DOMAINS, constant_array
from qdeploy.stages.quantize.lower._base import (
    LoweringEditor,
    Match,
    Rule,
    SiteRecord,
    missing_constants,
    only_consumer,
    single_use,
)
from qdeploy.stages.quantize.lower._grid import AffineFakeQuant
from qdeploy.stages.quantize.lower._reference import decomposed_fake_quant

if TYPE_CHECKING:
    import onnx_ir as ir


def _standard(node: ir.Node | None, *op_types: str) -> bool:
    return node is not None and node.op_type in op_types and node.domain in AI_ONNX_DOMAINS


def _split_constant(node: ir.Node) -> tuple[ir.Value | None, np.ndarray | None, int]:
    """(the non-constant input, the constant operand, its index) of a binary node; the operand may be None."""
    first, second = constant_array(node.inputs[0]), constant_array(node.inputs[1])
    if second is not None or first is None:
        return node.inputs[0], second, 1
    return node.inputs[1], first, 0


def _zero_node(node: ir.Node | None) -> bool:
    """An Add of a zero point (either operand) or a Sub of its negation; the other operand is the data."""
    return _standard(node, "Add", "Sub") and len(node.inputs) == 2  # type: ignore[union-attr]


def _zero_value(node: ir.Node) -> np.ndarray | None:
    _, operand, index = _split_constant(node)
    if operand is None:
        return None
    if node.op_type == "Sub":
        return -operand if index == 1 else None  # zp - t is not a zero-point shift
    return operand


class Found(TypedDict, total=False):
    """What the walk around a Round found: the scales, zero points and Clip bounds, and which are there."""

    divide: bool
    pre_scale: np.ndarray | None
    post_scale: np.ndarray | None
    zero_before: np.ndarray | None
    zero_after: np.ndarray | None
    zero_out: np.ndarray | None
    has_zero_before: bool
    has_zero_after: bool
    has_zero_out: bool
    clip: tuple[np.ndarray | None, np.ndarray | None]


def _scale_input(node: ir.Node, found: Found) -> ir.Value | None:
    """The data input of the opening Div/Mul; records the scale (or None when computed at run time)."""
    data, operand, index = _split_constant(node)
    if node.op_type == "Div":
        if index != 1:
            return None
        found["divide"], found["pre_scale"] = True, operand
    else:
        found["divide"], found["pre_scale"] = False, operand
    return data


def _before_round(round_node: ir.Node, found: Found, nodes: list[ir.Node]) -> ir.Value | None:
    """Walks Round <- [Add] <- Div/Mul; returns the data input of the Div/Mul."""
    value = round_node.inputs[0]
    producer = value.producer() if value is not None else None
    if _zero_node(producer) and single_use(value):  # type: ignore[arg-type]
        found["zero_before"], found["has_zero_before"] = _zero_value(producer), True  # type: ignore[arg-type]
        nodes.append(producer)  # type: ignore[arg-type]
        value, _, _ = _split_constant(producer)  # type: ignore[arg-type]
        producer = value.producer() if value is not None else None
    if not _standard(producer, "Div", "Mul") or not single_use(value):  # type: ignore[arg-type]
        return None
    nodes.append(producer)  # type: ignore[arg-type]
    return _scale_input(producer, found)  # type: ignore[arg-type]


def _clip_bounds(clip: ir.Node) -> tuple[np.ndarray | None, np.ndarray | None]:
    if "min" in clip.attributes or "max" in clip.attributes:  # Clip before opset 11
        low = clip.attributes.get("min")
        high = clip.attributes.get("max")
        return (np.asarray(low.value) if low else None), (np.asarray(high.value) if high else None)
    low = constant_array(clip.inputs[1]) if len(clip.inputs) > 1 else None
    high = constant_array(clip.inputs[2]) if len(clip.inputs) > 2 else None
    return low, high


def _after_round(round_node: ir.Node, found: Found, nodes: list[ir.Node]) -> ir.Value | None:
    """Walks Round -> [Add] -> Clip -> [Sub] -> Mul; returns the Mul's output."""
    current = only_consumer(round_node.outputs[0])
    if _zero_node(current):
        found["zero_after"], found["has_zero_after"] = _zero_value(current), True  # type: ignore[arg-type]
        nodes.append(current)  # type: ignore[arg-type]
        current = only_consumer(current.outputs[0])  # type: ignore[union-attr]
    if not _standard(current, "Clip"):
        return None
    nodes.append(current)  # type: ignore[arg-type]
    found["clip"] = _clip_bounds(current)  # type: ignore[arg-type]
    current = only_consumer(current.outputs[0])  # type: ignore[union-attr]
    if _standard(current, "Sub") and constant_array(current.inputs[1]) is not None:  # type: ignore[union-attr]
        found["zero_out"], found["has_zero_out"] = constant_array(current.inputs[1]), True  # type: ignore
        nodes.append(current)  # type: ignore[arg-type]
        current = only_consumer(current.outputs[0])  # type: ignore[union-attr]
    if not _standard(current, "Mul"):
        return None
    nodes.append(current)  # type: ignore[arg-type]
    _, found["post_scale"], _ = _split_constant(current)  # type: ignore[arg-type]
    return current.outputs[0]  # type: ignore[union-attr]


def decomposed_pattern(node: ir.Node) -> Match | None:
    if not _standard(node, "Round") or node.inputs[0] is None:
        return None
    found: Found = {}
    before: list[ir.Node] = []
    after: list[ir.Node] = []
    x = _before_round(node, found, before)
    y = _after_round(node, found, after) if x is not None else None
    if x is None or y is None:
        return None
    constants = {key: found.get(key) for key in ("pre_scale", "post_scale", "zero_before", "zero_after", "zero_out")}
    low, high = found["clip"]
    constants.update(clip_low=low, clip_high=high)
    flags = {key: found.get(key, False) for key in ("divide", "has_zero_before", "has_zero_after", "has_zero_out")}
    return Match([node, *before, *after], x, y, constants, flags)


def decomposed_check(match: Match) -> str | None:
    needed = ["pre_scale", "post_scale", "clip_low", "clip_high"]
    needed += [name for name in ("zero_before", "zero_after", "zero_out") if match.attributes[f"has_{name}"]]
    refusal = missing_constants(match, tuple(needed))
    if refusal:
        return refusal
    if np.any(np.asarray(match.constants["pre_scale"]) <= 0) or np.any(np.asarray(match.constants["post_scale"]) <= 0):
        return "scales must be positive constants"
    bounds = np.array([match.constants["clip_low"], match.constants["clip_high"]], dtype=np.float64).ravel()
    if bounds.size != 2 or np.any(np.abs(bounds - np.round(bounds)) > 1e-6):
        return f"Clip bounds {bounds.tolist()} are not two integers"
    if match.attributes["has_zero_before"] and match.attributes["has_zero_after"]:
        return "zero point added both before and after Round"
    return None


def decomposed_affine(match: Match) -> AffineFakeQuant:
    constants = match.constants
    pre = np.asarray(constants["pre_scale"], dtype=np.float64)
    s_in = pre if match.attributes["divide"] else 1.0 / pre
    zero_in = constants["zero_before"] if match.attributes["has_zero_before"] else constants["zero_after"]
    z_in = np.asarray(zero_in if zero_in is not None else 0.0, dtype=np.float64)
    z_out = np.asarray(constants["zero_out"] if constants["zero_out"] is not None else 0.0, dtype=np.float64)
    return AffineFakeQuant(s_in=s_in, z_in=z_in, s_out=np.asarray(constants["post_scale"], dtype=np.float64),
                           z_out=z_out, qmin=round(float(constants["clip_low"])),  # type: ignore[arg-type]
                           qmax=round(float(constants["clip_high"])))  # type: ignore[arg-type]


def decomposed_replacement(match: Match, editor: LoweringEditor) -> SiteRecord:
    constants = match.constants
    reference = partial(decomposed_fake_quant, pre_scale=constants["pre_scale"], divide=match.attributes["divide"],
                        zero_before=constants["zero_before"], zero_after=constants["zero_after"],
                        clip_low=float(constants["clip_low"]), clip_high=float(constants["clip_high"]),  # type: ignore
                        zero_out=constants["zero_out"], post_scale=constants["post_scale"])
    return editor.lower_fake_quant(match, "decomposed_fake_quant", decomposed_affine(match), reference)


RULES = (Rule("decomposed_fake_quant", decomposed_pattern, decomposed_replacement, decomposed_check),)
