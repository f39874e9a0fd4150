"""Numpy references of the fake-quant semantics that ``mode: lower`` replaces.

Each function follows its framework's definition literally (not the affine form
the lowering derives), so that checking a lowered model against it checks the
derivation too.  Parameters are already laid out to broadcast against ``x``.
Rounding is half to even (``np.round``), as in OneFlow's ``nearbyint`` and
ONNX's QuantizeLinear; frameworks differ on ties, which verification
tolerates within one step.
"""

from __future__ import annotations

import numpy as np


def openvino_fake_quantize(x: np.ndarray, input_low: np.ndarray, input_high: np.ndarray, output_low: np.ndarray,
                           output_high: np.ndarray, levels: int) -> np.ndarray:
    """OpenVINO FakeQuantize: clamp to [input_low, input_high], quantize to `levels`, map onto the output range."""
    x = np.asarray(x, dtype=np.float64)
    il, ih, ol, oh = (np.asarray(a, dtype=np.float64) for a in (input_low, input_high, output_low, output_high))
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.round((x - il) / (ih - il) * (levels - 1))
        inside = q / (levels - 1) * (oh - ol) + ol
    below = x <= np.minimum(il, ih)
    above = x > np.maximum(il, ih)
    return np.where(below, ol, np.where(above, oh, inside))


def oneflow_fake_quantization(x: np.ndarray, scale: np.ndarray, zero_point: np.ndarray, bits: int, scheme: str,
                              formula: str) -> np.ndarray:
    """OneFlow's fake_quantization kernel (google symmetric/affine, cambricon power-of-two)."""
    x = np.asarray(x, dtype=np.float64)
    scale = np.asarray(scale, dtype=np.float64)
    if formula == "cambricon":
        step = np.power(2.0, np.trunc(scale))
        upper = 2.0 ** (bits - 1) - 1
        return np.clip(np.round(x / step), -upper - 1, upper) * step
    if scheme == "symmetric":
        upper = 2.0 ** (bits - 1) - 1
        return np.clip(np.round(x / scale), -upper - 1, upper) * scale
    zero = np.round(np.asarray(zero_point, dtype=np.float64)).astype(np.uint8).astype(np.float64)
    upper = 2.0 ** bits - 1
    return (np.clip(np.round(x / scale + zero), 0, upper) - zero) * scale


def oneflow_observer(values: np.ndarray, bits: int, scheme: str, formula: str,
                     per_layer: bool) -> tuple[np.ndarray, np.ndarray]:
    """OneFlow's min_max_observer: (scale, zero_point) of a tensor, per layer or per slice along axis 0."""
    values = np.asarray(values, dtype=np.float64)
    rows = values.reshape(1, -1) if per_layer else values.reshape(values.shape[0], -1)
    low, high = rows.min(axis=1), rows.max(axis=1)
    return observer_params(low, high, bits, scheme, formula)


def observer_params(low: np.ndarray, high: np.ndarray, bits: int, scheme: str, formula: str, *,
                    round_zero: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """OneFlow's scale and zero point from a minimum and maximum; the moving-average observer does not
    round its affine zero point (fake_quantization rounds it when it is used)."""
    low, high = np.asarray(low, dtype=np.float64), np.asarray(high, dtype=np.float64)
    if formula == "cambricon":
        magnitude = np.maximum(np.abs(low), np.abs(high))
        return np.floor(np.log2(magnitude)) - (bits - 2), np.zeros_like(magnitude)
    if scheme == "symmetric":
        magnitude = np.maximum(np.abs(low), np.abs(high))
        return magnitude / (2.0 ** (bits - 1) - 1), np.zeros_like(magnitude)
    scale = (high - low) / (2.0 ** bits - 1)
    return scale, -np.round(low / scale) if round_zero else -low / scale


def decomposed_fake_quant(x: np.ndarray, *, pre_scale: np.ndarray, divide: bool, zero_before: np.ndarray | None,
                          zero_after: np.ndarray | None, clip_low: float, clip_high: float,
                          zero_out: np.ndarray | None, post_scale: np.ndarray) -> np.ndarray:
    """Div(x, s) or Mul(x, 1/s), [Add(zp)], Round, [Add(zp)], Clip, [Sub(zp)], Mul(s): evaluated as written."""
    value = np.asarray(x, dtype=np.float64)
    value = value / pre_scale if divide else value * pre_scale
    if zero_before is not None:
        value = value + zero_before
    value = np.round(value)
    if zero_after is not None:
        value = value + zero_after
    value = np.clip(value, clip_low, clip_high)
    if zero_out is not None:
        value = value - zero_out
    return value * post_scale


def quantize_linear(x: np.ndarray, scale: np.ndarray, zero_point: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """ONNX QuantizeLinear (parameters laid out to broadcast): saturate(round(x / scale) + zero_point)."""
    info = np.iinfo(dtype)
    value = np.round(np.asarray(x, dtype=np.float64) / scale) + np.asarray(zero_point, dtype=np.float64)
    return np.clip(value, info.min, info.max).astype(dtype)
