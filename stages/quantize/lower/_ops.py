"""Lowering rules for fake-quant ops of custom domains: OpenVINO's FakeQuantize and OneFlow's fake_quantization.

OneFlow's exporter feeds ``fake_quantization`` from ``min_max_observer`` (weights)
and ``moving_average_min_max_observer`` (activations, whose moving statistics are
stored in the model); the observer rules run first and turn those producers into
constants.
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING, TypedDict

import numpy as np

from qdeploy.graph.edit import attribute, constant_array
from qdeploy.stages.quantize.lower._base import LoweringEditor, Match, Rule, SiteRecord, missing_constants
from qdeploy.stages.quantize.lower._grid import AffineFakeQuant
from qdeploy.stages.quantize.lower._reference import (
    observer_params,
    oneflow_fake_quantization,
    oneflow_observer,
    openvino_fake_quantize,
)

if TYPE_CHECKING:
    import onnx_ir as ir

_SCHEMES = ("symmetric", "affine")
_FORMULAS = ("google", "cambricon")


def _constants(node: ir.Node, names: tuple[str, ...]) -> dict[str, np.ndarray | None]:
    return {name: constant_array(node.inputs[index] if index < len(node.inputs) else None)
            for index, name in enumerate(names)}


# ---- OpenVINO FakeQuantize -----------------------------------------------------------------------

_FQ_INPUTS = ("x", "input_low", "input_high", "output_low", "output_high")


def openvino_pattern(node: ir.Node) -> Match | None:
    if node.op_type != "FakeQuantize" or len(node.inputs) != 5 or node.inputs[0] is None:
        return None
    return Match([node], node.inputs[0], node.outputs[0], _constants(node, _FQ_INPUTS),
                 {"levels": int(attribute(node, "levels", 256))})


def openvino_check(match: Match) -> str | None:
    missing = missing_constants(match, _FQ_INPUTS[1:])
    if missing:
        return missing
    low, high = match.constants["input_low"], match.constants["input_high"]
    if np.any(np.asarray(high) < np.asarray(low)):
        return "input_high below input_low"
    if np.any(np.asarray(match.constants["output_high"]) < np.asarray(match.constants["output_low"])):
        return "output_high below output_low (a negating FakeQuantize)"
    if match.attributes["levels"] < 2:
        return f"levels {match.attributes['levels']}"
    return None


def openvino_affine(constants: dict[str, np.ndarray | None], levels: int) -> AffineFakeQuant:
    """FakeQuantize's affine form: q = round((x - il) / s_in) on [0, levels-1], y = q * s_out + ol."""
    il, ih, ol, oh = (np.asarray(constants[name], dtype=np.float64) for name in _FQ_INPUTS[1:])
    s_in, s_out = (ih - il) / (levels - 1), (oh - ol) / (levels - 1)
    s_in, s_out = np.where(s_in > 0, s_in, 1.0), np.where(s_out > 0, s_out, 1.0)  # a constant channel
    return AffineFakeQuant(s_in=s_in, z_in=-il / s_in, s_out=s_out, z_out=-ol / s_out, qmin=0, qmax=levels - 1)


def openvino_replacement(match: Match, editor: LoweringEditor) -> SiteRecord:
    levels = match.attributes["levels"]
    constants = match.constants
    reference = partial(openvino_fake_quantize, input_low=constants["input_low"], input_high=constants["input_high"],
                        output_low=constants["output_low"], output_high=constants["output_high"], levels=levels)
    return editor.lower_fake_quant(match, "openvino_fake_quantize", openvino_affine(constants, levels), reference)


# ---- OneFlow fake_quantization and its observers ----------------------------------------------------

class OneflowSettings(TypedDict, total=False):
    """A OneFlow fake_quantization's (or observer's) attributes, as its rules read them."""

    bits: int
    scheme: str
    formula: str
    op: str
    """Observers only: ``min_max_observer`` or ``moving_average_min_max_observer``."""
    per_layer: bool
    training: bool


def _oneflow_settings(node: ir.Node) -> OneflowSettings:
    return {"bits": int(attribute(node, "quantization_bit", 8)),
            "scheme": str(attribute(node, "quantization_scheme", "symmetric")),
            "formula": str(attribute(node, "quantization_formula", "google"))}


def _settings_refusal(settings: OneflowSettings) -> str | None:
    if settings["scheme"] not in _SCHEMES:
        return f"quantization_scheme '{settings['scheme']}' (known: {', '.join(_SCHEMES)})"
    if settings["formula"] not in _FORMULAS:
        return f"quantization_formula '{settings['formula']}' (known: {', '.join(_FORMULAS)})"
    if not 2 <= settings["bits"] <= 16:
        return f"quantization_bit {settings['bits']} outside 2..16"
    return None


def oneflow_pattern(node: ir.Node) -> Match | None:
    if node.op_type != "fake_quantization" or not node.inputs or node.inputs[0] is None:
        return None
    return Match([node], node.inputs[0], node.outputs[0], _constants(node, ("x", "scale", "zero_point")),
                 _oneflow_settings(node))


def oneflow_check(match: Match) -> str | None:
    refusal = _settings_refusal(match.attributes)
    needed = ("scale",) if match.attributes["scheme"] == "symmetric" else ("scale", "zero_point")
    refusal = refusal or missing_constants(match, needed)
    if refusal:
        return refusal
    scale = np.asarray(match.constants["scale"])
    if scale.size > 1 and match.x.shape is None:
        return "per-channel scales on a tensor of unknown rank"
    if match.attributes["formula"] == "google" and np.any(scale <= 0):
        return "non-positive scale"
    return None


def _along_first_axis(array: np.ndarray, rank: int | None) -> np.ndarray:
    """OneFlow's per-channel parameters run along axis 0 of the data; lay them out to broadcast."""
    array = np.asarray(array, dtype=np.float64).reshape(-1)
    if array.size == 1:
        return array.reshape(())
    return array.reshape([array.size] + [1] * ((rank or 1) - 1))


def oneflow_affine(scale: np.ndarray, zero: np.ndarray, settings: OneflowSettings) -> AffineFakeQuant:
    bits = settings["bits"]
    if settings["formula"] == "cambricon":
        step = np.power(2.0, np.trunc(scale))
        return AffineFakeQuant(step, np.zeros_like(step), step, np.zeros_like(step), -(2 ** (bits - 1)),
                               2 ** (bits - 1) - 1)
    if settings["scheme"] == "symmetric":
        zeros = np.zeros_like(scale)
        return AffineFakeQuant(scale, zeros, scale, zeros, -(2 ** (bits - 1)), 2 ** (bits - 1) - 1)
    rounded = np.round(zero).astype(np.uint8).astype(np.float64)
    return AffineFakeQuant(scale, rounded, scale, rounded, 0, 2 ** bits - 1)


def oneflow_replacement(match: Match, editor: LoweringEditor) -> SiteRecord:
    rank = len(match.x.shape) if match.x.shape is not None else None
    scale = _along_first_axis(match.constants["scale"], rank)  # type: ignore[arg-type]
    raw_zero = match.constants.get("zero_point")
    zero = _along_first_axis(raw_zero if raw_zero is not None else np.zeros(1), rank)
    reference = partial(oneflow_fake_quantization, scale=scale, zero_point=zero, bits=match.attributes["bits"],
                        scheme=match.attributes["scheme"], formula=match.attributes["formula"])
    return editor.lower_fake_quant(match, "oneflow_fake_quantization",
                                   oneflow_affine(scale, zero, match.attributes), reference)


def observer_pattern(node: ir.Node) -> Match | None:
    if node.op_type not in ("min_max_observer", "moving_average_min_max_observer") or node.inputs[0] is None:
        return None
    names = ("x",) if node.op_type == "min_max_observer" else ("x", "train_step", "moving_max", "moving_min")
    settings: OneflowSettings = {**_oneflow_settings(node), "op": node.op_type,
                "per_layer": bool(attribute(node, "per_layer_quantization", 1)),
                "training": bool(attribute(node, "training", 0))}
    return Match([node], node.inputs[0], node.outputs[0], _constants(node, names), settings)


def observer_check(match: Match) -> str | None:
    refusal = _settings_refusal(match.attributes)
    if refusal:
        return refusal
    if match.attributes["op"] == "min_max_observer":
        return missing_constants(match, ("x",))
    if match.attributes["training"]:
        return "moving-average observer in training mode: its statistics change with every input"
    return missing_constants(match, ("moving_max", "moving_min"))


def observer_replacement(match: Match, editor: LoweringEditor) -> SiteRecord:
    """The observer's (scale, zero_point) computed now and stored as initializers."""
    settings = match.attributes
    node = match.nodes[0]
    if settings["op"] == "min_max_observer":
        scale, zero = oneflow_observer(match.constants["x"], settings["bits"], settings["scheme"],  # type: ignore
                                       settings["formula"], settings["per_layer"])
    else:
        high = np.asarray(match.constants["moving_max"], dtype=np.float64)
        # symmetric and cambricon scales come from moving_max alone; the affine zero point is left unrounded
        low = high if settings["scheme"] == "symmetric" else np.asarray(match.constants["moving_min"])
        scale, zero = observer_params(low, high, settings["bits"], settings["scheme"], settings["formula"],
                                      round_zero=False)
    for output, array in zip(node.outputs, (scale, zero), strict=False):
        constant = editor.initializer(f"{output.name}_constant", np.asarray(array, dtype=np.float32).reshape(-1))
        output.replace_all_uses_with(constant, replace_graph_outputs=True)
    editor.graph.remove(node, safe=True)
    return {"rule": "oneflow_observer", "nodes": match.names, "kind": "observer", "scale": np.ravel(scale).tolist()[:8]}


RULES = (
    Rule("oneflow_observer", observer_pattern, observer_replacement, observer_check),
    Rule("oneflow_fake_quantization", oneflow_pattern, oneflow_replacement, oneflow_check),
    Rule("openvino_fake_quantize", openvino_pattern, openvino_replacement, openvino_check),
)
