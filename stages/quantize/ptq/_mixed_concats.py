"""Concats that join tensors of very different ranges stay float.

A Concat's output takes one scale.  Where its inputs' calibrated ranges differ by much (a Keras text CNN joins
embeddings of |x| < 4 with the element-wise Max of convolution branches that reach 670, then a BatchNormalization
evens the channels out), that one scale leaves the narrow inputs a handful of levels: they are rounded away before
the BatchNormalization could restore them, and the model's output fell to cosine 0.88 (ONNX Runtime) and 0.28
(OpenVINO, whose placement also puts the Concat's inputs on the union range).  NNCF never quantizes a Concat of its
own accord; the next quantized consumer (here the Dense layer's MatMul, after the BatchNormalization) quantizes the
evened-out values instead.

Here a Concat whose narrowest input would get fewer than :data:`MIN_LEVELS` (16, 4 bits: the depthwise inputs'
bound) of the 256 levels on the union of its inputs' ranges is excluded from quantization: it reads its inputs as
they come (dequantized or float) and writes float.  Concats whose inputs agree (feature pyramids, detection necks:
at most 4x apart in the corpus) keep their int8 path, which OpenVINO and ONNX Runtime run without requantizing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from qdeploy.stages.quantize.ptq._depthwise import MIN_LEVELS

if TYPE_CHECKING:
    from collections.abc import Container

    import onnx

__all__ = ["mixed_range_concats"]


def mixed_range_concats(model: onnx.ModelProto, ranges: dict[str, tuple[float, float]], op_types: list[str],
                        excluded: Container[str] = ()) -> dict[str, float]:
    """Concat node name -> the levels its narrowest input would get, for each Concat to keep float (see module)."""
    if "Concat" not in op_types:
        return {}
    found: dict[str, float] = {}
    for node in model.graph.node:
        if node.op_type != "Concat" or node.name in excluded:
            continue
        live = [ranges[name] for name in node.input if name in ranges]  # calibrated activations, never constants
        union = _span((min(low for low, _ in live), max(high for _, high in live))) if len(live) > 1 else 0.0
        if union <= 0:
            continue
        levels = 255 * min(_span(bounds) for bounds in live) / union
        if levels < MIN_LEVELS:
            found[node.name] = round(levels, 2)
    return found


def _span(bounds: tuple[float, float]) -> float:
    """The width of a range as the quantizer takes it: zero is always representable."""
    low, high = bounds
    return max(float(high), 0.0) - min(float(low), 0.0)
