"""Scale estimation for weight-only blocks (``scale_estimation: true``): each block's scale (and zero point)
fitted to the weights it stands for, weighted by how much each reduction row matters to the MatMul's output.

Round to nearest takes a block's scale from its extremes (``_pack.block_quantize``), which wastes levels on one
outlier and ignores the inputs.  Here each block starts from that scale and alternates two exact steps, as HQQ
and NNCF's scale estimation do in their own ways: with the integers fixed, the scale (and zero point) that
minimise ``sum_k h_k (w_k - s (q_k - z))^2`` are a weighted least-squares solution; with the scale fixed,
rounding to nearest gives the best integers.  A step is kept only where it lowers the block's weighted error,
so the result is never worse than round to nearest.  ``h_k`` is the mean square of the MatMul's input channel k
on calibration data (the Hessian's diagonal; NNCF weights its scale search by the same statistic), or 1
without data (embeddings).

Zero points are integers (MatMulNBits and GatherBlockQuantized store them in 4 or 8 bits), or floats
(``zero_points: float``, as ONNX Runtime's HQQ quantizer writes MatMulNBits: a float32 per block): a float zero
point lets a block's levels sit anywhere, which recovers weights that were stored on a 4-bit grid with a float
offset (GGUF's Q4_1) exactly.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

__all__ = ["ITERATIONS", "estimate_blocks", "fit_blocks"]

ITERATIONS = 20
"""Least-squares/rounding rounds per block: the weighted error stops falling after a handful."""
_SLICE_VALUES = 1 << 22
"""Weights fitted at once (float64 working arrays of this many values, a few times over)."""


def _slices(rows: int, cols: int) -> Iterator[tuple[int, int]]:
    step = max(1, _SLICE_VALUES // max(rows, 1))
    for start in range(0, cols, step):
        yield start, min(cols, start + step)


def estimate_blocks(weight: np.ndarray, importance: np.ndarray | None, bits: int, group: int, symmetric: bool,
                    float_zero: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Fitted blocks of a [K, N] weight along K: integers [Kp, N] (int8 holding signed values when symmetric,
    uint8 with zero points otherwise; Kp = K padded to whole groups), scales [Kp/group, N] float32 and zero points
    [Kp/group, N] (uint8, float32 with ``float_zero``; None when symmetric).  ``importance`` [K]: the weight of
    each reduction row in the error (None: all alike).  The layout of ``_gptq.gptq``'s result."""
    rows, cols = weight.shape
    padded = -(-rows // group) * group
    blocks = padded // group
    ints = np.zeros((padded, cols), np.int8 if symmetric else np.uint8)
    scales = np.zeros((blocks, cols), np.float32)
    zeros = None if symmetric else np.zeros((blocks, cols), np.float32 if float_zero else np.uint8)
    weights = np.ones(padded) if importance is None else np.pad(np.maximum(importance.astype(np.float64), 0),
                                                               (0, padded - rows))
    weights = np.where(weights > 0, weights, 1e-12)[:, None]  # a dead input still gets its weights rounded
    for start, stop in _slices(padded, cols):
        piece = np.zeros((padded, stop - start))
        piece[:rows] = weight[:, start:stop]
        grouped = piece.reshape(blocks, group, -1)  # [blocks, group, n]: a block runs down one column
        q, scale, zero = fit_blocks(grouped, weights.reshape(blocks, group, 1), bits, symmetric, float_zero)
        ints[:, start:stop] = q.reshape(padded, -1)
        scales[:, start:stop] = scale[:, 0]
        if zeros is not None:
            zeros[:, start:stop] = zero[:, 0]
    return ints, scales, zeros


def fit_blocks(blocks: np.ndarray, weights: np.ndarray, bits: int, symmetric: bool, float_zero: bool
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Fit blocks along axis 1 of ``blocks`` [B, group, n] (``weights`` broadcast to it): integers, scales and
    zero points [B, 1, n] (zeros all 0 when symmetric)."""
    low, high = (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1) if symmetric else (0, 2**bits - 1)
    scale, zero = _start(blocks, bits, symmetric, float_zero)
    q = _round(blocks, scale, zero, low, high)
    best = _error(blocks, weights, q, scale, zero)
    for _ in range(ITERATIONS):
        new_scale, new_zero = _least_squares(blocks, weights, q, scale, zero, symmetric, float_zero, low, high)
        new_q = _round(blocks, new_scale, new_zero, low, high)
        error = _error(blocks, weights, new_q, new_scale, new_zero)
        better = error < best
        if not better.any():
            break
        scale, zero = np.where(better, new_scale, scale), np.where(better, new_zero, zero)
        q, best = np.where(better, new_q, q), np.minimum(error, best)
    return q, scale.astype(np.float32), zero


def _start(blocks: np.ndarray, bits: int, symmetric: bool, float_zero: bool) -> tuple[np.ndarray, np.ndarray]:
    """Round to nearest's scale and zero point (``_pack.block_quantize``'s rule), or min/max over the block's
    own range with a float zero point (it need not contain 0)."""
    top, bottom = blocks.max(axis=1, keepdims=True), blocks.min(axis=1, keepdims=True)
    if symmetric:
        extreme = np.where(np.abs(top) > np.abs(bottom), top, bottom)
        scale = extreme / -(2 ** (bits - 1))
        return np.where(scale == 0, 1.0, scale), np.zeros_like(scale)
    levels = 2**bits - 1
    if not float_zero:
        bottom, top = np.minimum(bottom, 0), np.maximum(top, 0)
    scale = (top - bottom) / levels
    scale = np.where(scale == 0, 1.0, scale)
    zero = -bottom / scale
    return scale, zero if float_zero else np.clip(np.rint(zero), 0, levels)


def _round(blocks: np.ndarray, scale: np.ndarray, zero: np.ndarray, low: int, high: int) -> np.ndarray:
    return np.clip(np.rint(blocks / scale + zero), low, high)


def _error(blocks: np.ndarray, weights: np.ndarray, q: np.ndarray, scale: np.ndarray, zero: np.ndarray
           ) -> np.ndarray:
    return np.sum(weights * (blocks - (q - zero) * scale) ** 2, axis=1, keepdims=True)


def _least_squares(blocks: np.ndarray, weights: np.ndarray, q: np.ndarray, scale: np.ndarray, zero: np.ndarray,
                   symmetric: bool, float_zero: bool, low: int, high: int) -> tuple[np.ndarray, np.ndarray]:
    """The scale (and zero point) minimising the weighted error for the integers ``q``; a block whose system is
    degenerate (one level used) keeps its scale."""
    if symmetric:
        return _scale_for(blocks, weights, q, scale), zero
    # w ~ s q + c, two unknowns per block: the normal equations of the weighted fit
    total, sum_q = weights.sum(axis=1, keepdims=True), (weights * q).sum(axis=1, keepdims=True)
    sum_qq = (weights * q * q).sum(axis=1, keepdims=True)
    sum_w, sum_wq = (weights * blocks).sum(axis=1, keepdims=True), (weights * blocks * q).sum(axis=1, keepdims=True)
    det = total * sum_qq - sum_q * sum_q
    solvable = np.abs(det) > 1e-12 * np.maximum(total * sum_qq, 1e-300)
    safe = np.where(solvable, det, 1.0)
    new_scale = np.where(solvable, (total * sum_wq - sum_q * sum_w) / safe, scale)
    offset = (sum_qq * sum_w - sum_q * sum_wq) / safe
    new_scale = np.where(np.abs(new_scale) > 1e-30, new_scale, scale)
    new_zero = np.where(solvable, -offset / new_scale, zero)
    if float_zero:
        return new_scale, new_zero
    new_zero = np.clip(np.rint(new_zero), low, high)  # stored in 4 or 8 bits: refit the scale to it
    return _scale_for(blocks, weights, q - new_zero, new_scale), new_zero


def _scale_for(blocks: np.ndarray, weights: np.ndarray, levels: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """The scale minimising sum h (w - s l)^2 for fixed levels l; ``scale`` where every level is 0."""
    numerator = (weights * blocks * levels).sum(axis=1, keepdims=True)
    denominator = (weights * levels * levels).sum(axis=1, keepdims=True)
    fitted = numerator / np.where(denominator > 0, denominator, 1.0)
    return np.where((denominator > 0) & (np.abs(fitted) > 1e-30), fitted, scale)
