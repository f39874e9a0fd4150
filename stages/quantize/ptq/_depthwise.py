"""A scale per channel at the inputs of depthwise convolutions, written as an exact rescaling, for graphs OpenVINO runs.

A depthwise convolution (one input channel per group) after a convolution with BatchNormalization folded in and a
HardSwish or ReLU reads channels whose ranges differ by 30x to 500x (a Paddle2ONNX LCNet/PicoDet layout detector:
its first depthwise input spans 0.39 in one channel and 39 in another).  One scale for the whole tensor leaves the
small channels two or three levels, and the depthwise convolution cannot mix them with the large ones to hide it:
each of its output channels is one input channel scaled.  The detector's int8 fell to cosine 0.49 on OpenVINO.

Each output channel of a depthwise convolution reads one input channel, so a factor per input channel moves into
its weights exactly: ``dw(x, w) = dw(x * k, w / k)``.  Where the calibration data shows a channel that the tensor's
one scale would give fewer than :data:`MIN_LEVELS` levels, the convolution reads ``Mul(x, k)`` through a Q/DQ pair
of its own, with ``k_c = peak / (HEADROOM peak_c)`` (at least 1, at most :data:`MOST_GAIN`) evening the channels
out, and its int8 weights' per-channel scales (and its int32 bias, requantized to the new scales) divided by
``k``: the same function in float, one scale per channel in effect.  NNCF writes a per-channel activation
quantizer there instead (its CPU setup allows one before depthwise convolutions, ``q8_a_ch``); ONNX Runtime fuses
such a DequantizeLinear into a QLinearConv, which then fails at run time ("input zero point must be a scalar")
wherever a Q follows the convolution (directly or after a Relu), so that form cannot serve a graph ONNX Runtime
also runs; NNCF's graphs are rewritten into this form (:func:`per_tensor_at_depthwise`).  The new pair is
symmetric with zero point 0: int8 where the tensor has negative values, uint8 where it has none (7 bits beside
7-bit activations).  Other readers of the tensor keep the per-tensor pair; a pair nobody reads any more is
removed.  Tensors a Concat reads or writes are left alone (int8 there is wrong on OpenVINO, ``_ptq``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from qdeploy.graph.utils import default_opset, fresh_name, node_readers
from qdeploy.stages.quantize.ptq._keep import RESCALING, remove_unused

if TYPE_CHECKING:
    import onnx

__all__ = ["MIN_LEVELS", "MOST_GAIN", "depthwise_inputs", "per_channel_at_depthwise", "per_tensor_at_depthwise"]

MIN_LEVELS = 16
"""Below this many levels of the per-tensor scale (4 bits), a channel of a depthwise input gets its own scale."""
MOST_GAIN = 256.0
"""The largest factor a channel is scaled by: channels below 1/256 of the largest are all but dead, and a larger
factor would push the int32 bias (divided by the same factor's scale) towards overflow."""
HEADROOM = 2.0
"""Each rescaled channel fills half the pair's range: a channel's values beyond its calibration peak (16 samples see
little of a small channel) are not clipped at once."""
_PER_AXIS_OPSET = 13  # DequantizeLinear takes ``axis`` (per-channel weight scales) from opset 13
_INT32_MAX = 2**31 - 1
_INT8 = 3  # TensorProto.INT8


def depthwise_inputs(model: onnx.ModelProto) -> set[str]:
    """Float tensors a depthwise Conv of ``model`` reads as its data input, directly (a float model) or through a
    DequantizeLinear (a QDQ model): Conv nodes whose ``group`` is above 1 and whose weight has one input channel."""
    producer = {out: node for node in model.graph.node for out in node.output if out}
    shapes = {init.name: tuple(init.dims) for init in model.graph.initializer}
    found = set()
    for conv, _ in _depthwise_convs(model, producer, shapes):
        source = producer.get(conv.input[0])
        if source is not None and source.op_type == "DequantizeLinear":
            quantizer = producer.get(source.input[0])
            found.add(quantizer.input[0] if quantizer is not None and quantizer.op_type == "QuantizeLinear"
                      else source.input[0])
        else:
            found.add(conv.input[0])
    return found


def per_channel_at_depthwise(model: onnx.ModelProto, peaks: dict[str, np.ndarray], *, seven_bit: bool = False,
                             int8_only: bool = False, skip: set[str] | frozenset[str] = frozenset()) -> list[str]:
    """Rescale the input of each depthwise Conv whose input pair would leave a channel fewer than
    :data:`MIN_LEVELS` levels (module docstring); ``peaks``: float tensor -> per-channel largest |value| on the
    calibration data; ``int8_only``: int8 even where a tensor is never negative (``activation_type: int8``);
    ``skip``: tensors to leave alone.  Returns the names of the Convs changed."""

    def choose(source: str, channels: int, quantize: onnx.NodeProto,
               initializers: dict[str, onnx.TensorProto]) -> _Rescaling | None:
        peak = peaks.get(source)
        step = _scalar(initializers, quantize.input[1])
        if source in skip or peak is None or step is None or len(peak) != channels or not _starved(peak, step):
            return None
        signed = _lowest(initializers, quantize.input[2], step) < 0 or int8_only
        top = float(peak.max())
        gain = np.maximum(top / np.maximum(peak * HEADROOM, top / MOST_GAIN), 1.0).astype(np.float32)
        scale = np.float32(top / (127 if signed or seven_bit else 255))
        return gain, scale, np.asarray(0, np.int8 if signed else np.uint8)

    return _rescale_depthwise_inputs(model, choose)


def per_tensor_at_depthwise(model: onnx.ModelProto) -> list[str]:
    """Rewrite per-channel activation pairs (zero point the same in every channel) at depthwise Conv inputs, as
    NNCF writes them, into the rescaled form: ``Mul(x, s / s_c)`` and one scale ``s``, the largest ``s_c`` (the
    same integers up to float rounding, the weights' scales divided by the same factors).  ONNX Runtime fuses the
    per-channel form into a QLinearConv that fails at run time ("input zero point must be a scalar") wherever a Q
    follows the convolution.  Returns the names of the Convs changed."""
    from onnx import numpy_helper

    def choose(source: str, channels: int, quantize: onnx.NodeProto,
               initializers: dict[str, onnx.TensorProto]) -> _Rescaling | None:
        if len(quantize.input) < 3 or not {quantize.input[1], quantize.input[2]} <= initializers.keys():
            return None
        scales = numpy_helper.to_array(initializers[quantize.input[1]]).astype(np.float64).reshape(-1)
        zeros = numpy_helper.to_array(initializers[quantize.input[2]]).reshape(-1)
        if scales.size != channels or channels == 1 or np.any(zeros != zeros[0]) or np.any(scales <= 0):
            return None
        return ((scales.max() / scales).astype(np.float32), np.float32(scales.max()),
                np.asarray(zeros[0], zeros.dtype))

    return _rescale_depthwise_inputs(model, choose)


_Rescaling = tuple[np.ndarray, np.float32, np.ndarray]
"""Per-channel gain, the new pair's scale and its zero point (a scalar array of the pair's type)."""


def _rescale_depthwise_inputs(model: onnx.ModelProto, choose: Callable[[str, int, onnx.NodeProto, dict[
        str, onnx.TensorProto]], _Rescaling | None]) -> list[str]:
    """Give each depthwise Conv for which ``choose(float input, channels, its QuantizeLinear, initializers)`` picks
    a rescaling ``Mul(x, gain)`` and a per-tensor pair of its own, its weights' scales (and int32 bias) divided by
    the gain; the Conv names changed."""
    if default_opset(model) < _PER_AXIS_OPSET:
        return []
    graph = model.graph
    producer = {out: node for node in graph.node for out in node.output if out}
    readers = node_readers(graph.node)
    initializers = {init.name: init for init in graph.initializer}
    shapes = {name: tuple(init.dims) for name, init in initializers.items()}
    taken = {*initializers, *producer, *(value.name for value in graph.input)}
    added: dict[int, list[onnx.NodeProto]] = {}  # id(conv) -> its Mul and pair, placed right before it
    for conv, channels in _depthwise_convs(model, producer, shapes):
        pair = _input_pair(conv, producer, initializers)
        parameters = _weight_and_bias(conv, producer, readers, initializers)
        chosen = None if pair is None or parameters is None else choose(pair[0].input[0], channels, pair[0],
                                                                       initializers)
        # a bias that would overflow int32 at the new scales leaves the Conv as it was
        if chosen is None or not _rescale_parameters(parameters, chosen[0], chosen[1], initializers):
            continue
        rank = len(shapes[_weight_name(conv, producer)])  # the input's rank: N, C and the spatial axes
        nodes, inits = _rescaled_pair(pair[0].input[0], *chosen, rank, pair[0].name, taken)
        graph.initializer.extend(inits)
        conv.input[0] = nodes[-1].output[0]
        added[id(conv)] = nodes
    changed = [node.name for node in graph.node if id(node) in added]
    if added:
        _place(model, added)
    return changed


def _depthwise_convs(model: onnx.ModelProto, producer: dict[str, onnx.NodeProto],
                     shapes: dict[str, tuple[int, ...]]) -> list[tuple[onnx.NodeProto, int]]:
    """(Conv, its channel count C) for each depthwise Conv: ``group`` C above 1 and a ``[C, 1, ...]`` weight (or a
    DequantizeLinear of one)."""
    found = []
    for node in model.graph.node:
        group = next((a.i for a in node.attribute if a.name == "group"), 1)
        if node.op_type != "Conv" or group <= 1:
            continue
        shape = shapes.get(_weight_name(node, producer))
        if shape is not None and len(shape) >= 2 and shape[:2] == (group, 1):  # no channel multiplier
            found.append((node, group))
    return found


def _weight_name(conv: onnx.NodeProto, producer: dict[str, onnx.NodeProto]) -> str:
    """The initializer holding ``conv``'s weight: itself, or what its DequantizeLinear reads."""
    source = producer.get(conv.input[1])
    return source.input[0] if source is not None and source.op_type == "DequantizeLinear" else conv.input[1]


def _input_pair(conv: onnx.NodeProto, producer: dict[str, onnx.NodeProto],
                initializers: dict[str, onnx.TensorProto]) -> tuple[onnx.NodeProto, onnx.NodeProto] | None:
    """The QuantizeLinear -> DequantizeLinear pair that feeds ``conv``'s data input, if any, both with the same
    scale and zero point (a pair that requantizes to other parameters is not a rounding to rescale)."""
    from onnx import numpy_helper

    dequantize = producer.get(conv.input[0])
    if dequantize is None or dequantize.op_type != "DequantizeLinear" or len(dequantize.input) < 3:
        return None
    quantize = producer.get(dequantize.input[0])
    if quantize is None or quantize.op_type != "QuantizeLinear" or len(quantize.input) < 3:
        return None
    for position in (1, 2):
        first, second = (initializers.get(node.input[position]) for node in (quantize, dequantize))
        if first is None or second is None or not np.array_equal(numpy_helper.to_array(first),
                                                                  numpy_helper.to_array(second)):
            return None
    return quantize, dequantize


def _starved(peak: np.ndarray, step: float) -> bool:
    """Whether one scale ``step`` leaves a channel that holds values fewer than MIN_LEVELS levels."""
    live = peak[peak > 0]
    return bool(live.size) and float(live.min()) / step < MIN_LEVELS


def _lowest(initializers: dict[str, onnx.TensorProto], zero_point: str, step: float) -> float:
    """The lowest value a per-tensor pair with this zero point and scale represents (int8 from -128, uint8 from 0)."""
    tensor = initializers.get(zero_point)
    bottom = -128 if tensor is not None and tensor.data_type == _INT8 else 0
    return (bottom - (_scalar(initializers, zero_point) or 0.0)) * step


def _scalar(initializers: dict[str, onnx.TensorProto], name: str) -> float | None:
    """The value of a one-element initializer (None: not an initializer, or several values)."""
    from onnx import numpy_helper

    tensor = initializers.get(name)
    if tensor is None:
        return None
    values = numpy_helper.to_array(tensor)
    return float(values) if values.size == 1 else None


def _rescaled_pair(source: str, gain: np.ndarray, scale: np.float32, zero: np.ndarray, rank: int, base: str,
                   taken: set[str]) -> tuple[list[onnx.NodeProto], list[onnx.TensorProto]]:
    """``Mul(source, gain)`` (``gain`` along axis 1) and a per-tensor Q/DQ pair (``scale``, ``zero``) on it."""
    from onnx import helper, numpy_helper

    names = {part: fresh_name(f"{base}_rescaled_{part}", taken) for part in ("gain", "scale", "zero", "q", "dq")}
    names["mul"] = fresh_name(f"{base}{RESCALING}", taken)  # what keep_float drops with the pair
    taken.update(names.values())
    shape = (1, len(gain), *([1] * (rank - 2)))
    nodes = [helper.make_node("Mul", [source, names["gain"]], [names["mul"]], name=names["mul"]),
             helper.make_node("QuantizeLinear", [names["mul"], names["scale"], names["zero"]], [names["q"]],
                              name=names["q"]),
             helper.make_node("DequantizeLinear", [names["q"], names["scale"], names["zero"]], [names["dq"]],
                              name=names["dq"])]
    return nodes, [numpy_helper.from_array(gain.reshape(shape), names["gain"]),
                   numpy_helper.from_array(np.asarray(scale, np.float32), names["scale"]),
                   numpy_helper.from_array(zero, names["zero"])]


def _weight_and_bias(conv: onnx.NodeProto, producer: dict[str, onnx.NodeProto],
                     readers: dict[str, list[onnx.NodeProto]], initializers: dict[str, onnx.TensorProto],
                     ) -> tuple[onnx.NodeProto, onnx.NodeProto | None] | None:
    """The DequantizeLinear of ``conv``'s int8 weight and of its int32 bias (None: a float bias or none), each read
    by ``conv`` alone with its scale an initializer; None where that does not hold (nothing to rescale safely)."""
    found = []
    for position in (1, 2):
        if position >= len(conv.input) or not conv.input[position]:
            found.append(None)
            continue
        node = producer.get(conv.input[position])
        if node is None:
            if position == 1:
                return None  # a float weight: the Conv is not quantized
            found.append(None)
            continue
        alone = len(readers.get(node.output[0], [])) == 1 and len(readers.get(node.input[1], [])) == 1
        if node.op_type != "DequantizeLinear" or not alone or not {node.input[0], node.input[1]} <= initializers.keys():
            return None
        if position == 2 and not _zero_or_absent(node, initializers):
            return None  # an int32 bias with a zero point is not the form ORT writes: left alone
        found.append(node)
    return found[0], found[1]


def _zero_or_absent(dequantize: onnx.NodeProto, initializers: dict[str, onnx.TensorProto]) -> bool:
    from onnx import numpy_helper

    if len(dequantize.input) < 3 or not dequantize.input[2]:
        return True
    zero = initializers.get(dequantize.input[2])
    return zero is not None and not numpy_helper.to_array(zero).any()


def _rescale_parameters(parameters: tuple[onnx.NodeProto, onnx.NodeProto | None], gain: np.ndarray,
                        scale: np.float32, initializers: dict[str, onnx.TensorProto]) -> bool:
    """Divide the weight's per-channel scales by ``gain`` (axis 0) and requantize the bias to the new input scale
    times the new weight scales; False (nothing changed) where the bias would not fit in int32."""
    from onnx import helper, numpy_helper

    weight, bias = parameters
    old = numpy_helper.to_array(initializers[weight.input[1]]).astype(np.float64)
    weight_scale = np.broadcast_to(old.reshape(-1), gain.shape) / gain
    if bias is not None:
        values = numpy_helper.to_array(initializers[bias.input[0]]).astype(np.float64)
        real = values * numpy_helper.to_array(initializers[bias.input[1]]).astype(np.float64)
        bias_scale = (np.float64(scale) * weight_scale).astype(np.float32)
        requantized = np.round(real / bias_scale.astype(np.float64))
        if not np.all(np.abs(requantized) <= _INT32_MAX):
            return False
        initializers[bias.input[1]].CopyFrom(numpy_helper.from_array(bias_scale, bias.input[1]))
        initializers[bias.input[0]].CopyFrom(numpy_helper.from_array(requantized.astype(np.int32), bias.input[0]))
    initializers[weight.input[1]].CopyFrom(numpy_helper.from_array(weight_scale.astype(np.float32),
                                                                   weight.input[1]))
    if len(weight.input) > 2 and weight.input[2] in initializers:  # a per-tensor zero point goes per channel too
        zero = numpy_helper.to_array(initializers[weight.input[2]])
        initializers[weight.input[2]].CopyFrom(numpy_helper.from_array(
            np.broadcast_to(zero.reshape(-1), gain.shape).copy(), weight.input[2]))
    del weight.attribute[:]
    weight.attribute.append(helper.make_attribute("axis", 0))
    return True


def _place(model: onnx.ModelProto, added: dict[int, list[onnx.NodeProto]]) -> None:
    """Put each new Mul and pair right before its Conv, then drop the old pairs nobody reads any more, with their
    parameters (``_keep.remove_unused``: subgraphs' reads count)."""
    ordered = []
    for node in model.graph.node:
        ordered.extend(added.get(id(node), []))
        ordered.append(node)
    del model.graph.node[:]
    model.graph.node.extend(ordered)
    remove_unused(model)
