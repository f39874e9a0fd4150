"""From a fake-quant's affine form to exact QuantizeLinear/DequantizeLinear parameters.

Every fake-quant form that ``mode: lower`` knows is first written in one affine form::

    y = (clip(round(x / s_in + z_in), qmin, qmax) - z_out) * s_out

with ``s_in, z_in, s_out, z_out`` arrays shaped to broadcast against ``x`` (per
tensor or along one axis) and integer bounds ``qmin, qmax``.  A
QuantizeLinear (``s_in``, ``z_in``) followed by a DequantizeLinear (``s_out``,
``z_out``) computes exactly this when the zero points are integers and the
integer range has 256 levels.  255 levels (narrow range) differ only for inputs
beyond the range, by one step.  Anything else (other level counts, zero off the
grid) is mapped to the nearest exact form: the same real range on a 256-level
grid with rounded zero points; ``max_difference`` measures what that costs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

Reference = Callable[[np.ndarray], np.ndarray]
_INTEGER_TOLERANCE = 1e-4
_FLOAT_NOISE = 1e-4
"""Differences below this fraction of a step are float32 rounding of the parameters, not a lowering cost."""
_SWEEP_PER_STEP = 64
_TYPE_RANGES = {np.dtype(np.uint8): (0, 255), np.dtype(np.int8): (-128, 127)}


class Refused(ValueError):
    """A matched fake-quant cannot be lowered; the message says why."""


@dataclass(frozen=True)
class AffineFakeQuant:
    """y = (clip(round(x / s_in + z_in), qmin, qmax) - z_out) * s_out; arrays broadcast against x."""

    s_in: np.ndarray
    z_in: np.ndarray
    s_out: np.ndarray
    z_out: np.ndarray
    qmin: int
    qmax: int

    @property
    def levels(self) -> int:
        return self.qmax - self.qmin + 1

    @property
    def param_shape(self) -> tuple[int, ...]:
        return tuple(np.broadcast_shapes(*(np.shape(a) for a in (self.s_in, self.z_in, self.s_out, self.z_out))))

    def evaluate(self, x: np.ndarray) -> np.ndarray:
        q = np.clip(np.round(x / self.s_in + self.z_in), self.qmin, self.qmax)
        return (q - self.z_out) * self.s_out


@dataclass(frozen=True)
class QdqParams:
    """QuantizeLinear and DequantizeLinear parameters: 1-D along ``axis`` or scalars when axis is None."""

    q_scale: np.ndarray
    q_zero: np.ndarray
    dq_scale: np.ndarray
    dq_zero: np.ndarray
    axis: int | None
    """Axis counted from the end of the data's shape (negative), None when per tensor."""
    notes: tuple[str, ...] = field(default=())

    @property
    def dtype(self) -> np.dtype:
        return self.q_zero.dtype

    @property
    def same_params(self) -> bool:
        return bool(np.array_equal(self.q_scale, self.dq_scale) and np.array_equal(self.q_zero, self.dq_zero))

    @property
    def step(self) -> float:
        return float(np.max(self.dq_scale))

    def evaluate(self, x: np.ndarray, param_shape: tuple[int, ...]) -> np.ndarray:
        """ONNX QuantizeLinear then DequantizeLinear on x (params laid out like param_shape)."""
        low, high = _TYPE_RANGES[self.dtype]
        q_scale, q_zero, dq_scale, dq_zero = (_laid_out(a, param_shape, self.axis) for a in
                                              (self.q_scale, self.q_zero, self.dq_scale, self.dq_zero))
        q = np.clip(np.round(x / q_scale) + q_zero, low, high)
        return (q - dq_zero) * dq_scale


def _laid_out(array: np.ndarray, param_shape: tuple[int, ...], axis: int | None) -> np.ndarray:
    if axis is None:
        return array.astype(np.float64)
    shape = [1] * len(param_shape)
    shape[axis] = array.size
    return array.astype(np.float64).reshape(shape)


def channel_axis(param_shape: tuple[int, ...]) -> int | None:
    """The axis (negative, counted from the end) along which the parameters vary; None when per tensor."""
    varying = [index for index, size in enumerate(param_shape) if size != 1]
    if not varying:
        return None
    if len(varying) > 1:
        raise Refused(f"quantization parameters vary along more than one axis (shape {list(param_shape)})")
    return varying[0] - len(param_shape)


def _along_axis(array: np.ndarray, param_shape: tuple[int, ...], axis: int | None) -> np.ndarray:
    """A parameter as 1-D along the axis (or a scalar), broadcast from its own shape."""
    full = np.broadcast_to(np.asarray(array, dtype=np.float64), param_shape)
    if axis is None:
        return np.asarray(full.reshape(-1)[0] if full.size else 0.0)
    return np.moveaxis(full, axis, 0).reshape(full.shape[axis], -1)[:, 0].copy()


def _is_integer(values: np.ndarray) -> bool:
    return bool(np.all(np.abs(values - np.round(values)) <= _INTEGER_TOLERANCE))


def exact_qdq(fake_quant: AffineFakeQuant) -> QdqParams:
    """The exact (or nearest exact) Q/DQ form of an affine fake-quant."""
    shape = fake_quant.param_shape
    axis = channel_axis(shape)
    s_in, z_in, s_out, z_out = (_along_axis(a, shape, axis) for a in
                                (fake_quant.s_in, fake_quant.z_in, fake_quant.s_out, fake_quant.z_out))
    if np.any(s_in <= 0) or np.any(s_out <= 0) or not np.all(np.isfinite([s_in, s_out])):
        raise Refused("scales must be positive and finite")
    levels = fake_quant.levels
    if levels < 2:
        raise Refused(f"{levels} quantization level(s): nothing to lower")
    notes: list[str] = []
    if levels in (255, 256) and _is_integer(z_in) and _is_integer(z_out):
        dtype, shift = _integer_type(fake_quant.qmin, fake_quant.qmax)
        if levels == 255:
            notes.append("narrow range (255 levels): inputs beyond the range may land one step further")
        return QdqParams(s_in.astype(np.float32), np.round(z_in + shift).astype(dtype), s_out.astype(np.float32),
                         np.round(z_out + shift).astype(dtype), axis, tuple(notes))
    factor = 1.0 if levels in (255, 256) else 255.0 / (levels - 1)
    if levels not in (255, 256):
        notes.append(f"{levels} levels re-gridded to 256 over the same range")
    if not (_is_integer(z_in) and _is_integer(z_out)):
        notes.append("zero point off the integer grid: rounded to the nearest level")
    zero_in = np.clip(np.round((z_in - fake_quant.qmin) * factor), 0, 255).astype(np.uint8)
    zero_out = np.clip(np.round((z_out - fake_quant.qmin) * factor), 0, 255).astype(np.uint8)
    return QdqParams((s_in / factor).astype(np.float32), zero_in, (s_out / factor).astype(np.float32), zero_out,
                     axis, tuple(notes))


def _integer_type(qmin: int, qmax: int) -> tuple[type, int]:
    """The 8-bit type holding [qmin, qmax] and the shift that moves it there."""
    if qmin >= 0 and qmax <= 255:
        return np.uint8, 0
    if qmin >= -128 and qmax <= 127:
        return np.int8, 0
    return np.uint8, -qmin


def max_difference(reference: Reference, fake_quant: AffineFakeQuant, qdq: QdqParams) -> float:
    """Largest |reference(x) - QDQ(x)| over a dense sweep of inputs covering every level of every channel.

    The sweep avoids exact rounding ties (frameworks round those differently); what remains is the cost
    of the lowered form, 0.0 for an exact one.
    """
    shape = fake_quant.param_shape
    levels = fake_quant.levels
    units = np.arange(-3 * _SWEEP_PER_STEP, (levels + 3) * _SWEEP_PER_STEP) / _SWEEP_PER_STEP + 1.0 / 257
    units = units.reshape((-1, *([1] * len(shape))))
    x = (units + fake_quant.qmin - np.asarray(fake_quant.z_in, dtype=np.float64)) * np.asarray(
        fake_quant.s_in, dtype=np.float64)
    x = np.broadcast_to(x, (units.shape[0], *shape)).astype(np.float32).astype(np.float64)
    expected = np.asarray(reference(x), dtype=np.float64)
    difference = float(np.max(np.abs(expected - qdq.evaluate(x, shape))))
    return 0.0 if difference <= _FLOAT_NOISE * qdq.step else difference


def fold_weight(values: np.ndarray, qdq: QdqParams) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
    """Fake-quantized weight values as (int8 data, scale, zero point, largest error) on the DQ grid.

    Symmetric int8 (zero point 0) is chosen when the values sit on it, since OpenVINO runs int8
    convolutions only with symmetric weights; otherwise the grid's own zero point, moved into int8.
    """
    axis = None if qdq.axis is None else values.ndim + qdq.axis
    scale = qdq.dq_scale.astype(np.float64)

    def laid(array: np.ndarray) -> np.ndarray:
        return array if axis is None else array.reshape([-1 if i == axis else 1 for i in range(values.ndim)])

    units = values.astype(np.float64) / laid(scale)
    if _is_integer(units) and np.all(np.round(units) >= -128) and np.all(np.round(units) <= 127):
        zero = np.zeros_like(qdq.dq_zero, dtype=np.int8)
    else:
        low, _ = _TYPE_RANGES[qdq.dtype]
        zero = np.clip(qdq.dq_zero.astype(np.int64) - 128 - low, -128, 127).astype(np.int8)
    data = np.clip(np.round(units) + laid(zero), -128, 127).astype(np.int8)
    restored = (data.astype(np.float64) - laid(zero)) * laid(scale.astype(np.float32))
    difference = float(np.max(np.abs(restored - values), initial=0.0))
    return data, scale.astype(np.float32), zero, 0.0 if difference <= _FLOAT_NOISE * qdq.step else difference
