"""Data-aware weight-only quantization for ``mode: weight_only``: GPTQ and the int4/int8 sensitivity of a weight.

Both read the Hessian of a MatMul's input, ``H = X^T X / rows`` over the calibration data (``_weight_only_data``),
so that what they minimise is the MatMul's *output* error ``||X (W - Q(W))||^2``, not the weight error.

GPTQ (Frantar et al. 2022, as ORT's ``GPTQWeightOnlyQuantConfig`` and NNCF's ``gptq=True`` run it): the
reduction rows of ``W`` [K, N] are quantized one at a time, and the rounding error of each is spread over the rows
not yet quantized through the inverse Hessian's Cholesky factor, so later rows absorb it where the inputs are
correlated.  A block's scale is taken (with the same rule as round to nearest, ``block_quantize``) from the
updated rows when the block starts.  The result is integers, scales and zero points in the block layout of round
to nearest: the same tensors and ops, only different values.

``act_order`` (GPTQ's "desc_act"): the rows are taken in descending order of their input's mean square (the
Hessian's diagonal), so the rows that matter most are rounded first, while many rows remain to absorb their error.
The block scales are then fixed before the walk, from the blocks as they are (AutoGPTQ's "static groups"): each
block keeps its contiguous rows, so the layout and the ops stay those of round to nearest.
"""

from __future__ import annotations

import numpy as np

from qdeploy.stages.quantize.weight_only._pack import block_quantize
from qdeploy.stages.quantize.weight_only._scales import fit_blocks

__all__ = ["DAMP", "dequantize", "gptq", "int4_output_error", "output_error", "rtn_dequantized"]

DAMP = 0.01
"""Share of the mean Hessian diagonal added to it (ORT's ``percdamp``, NNCF's ``damp_percent`` default)."""
_BLOCK = 128
"""Rows whose error is applied to the rest at once (lazy batch updates); a multiple of the group."""


def _padded(weight: np.ndarray, hessian: np.ndarray, group: int) -> tuple[np.ndarray, np.ndarray]:
    """W^T [N, Kp] in float64 and H [Kp, Kp] with K padded to whole groups; dead inputs (never non-zero in the
    calibration data, padding included) get a unit diagonal and zero weight, as GPTQ does."""
    rows, cols = weight.shape
    padded = -(-rows // group) * group
    transposed = np.zeros((cols, padded), np.float64)
    transposed[:, :rows] = weight.T
    full = np.zeros((padded, padded), np.float64)
    full[:rows, :rows] = hessian
    dead = np.diag(full) <= 0
    full[dead, dead] = 1.0
    transposed[:, dead] = 0.0
    full[np.diag_indices(padded)] += DAMP * float(np.mean(np.diag(full)))
    return transposed, full


_last: list[tuple[np.ndarray, int, np.ndarray]] = []
"""The last (Hessian, group, factor): MatMuls sharing an input (q/k/v) come one after another, and the K^3
inversion is most of GPTQ's time."""


def _upper_inverse_factor(hessian: np.ndarray, padded: np.ndarray, group: int) -> np.ndarray:
    """U with H^-1 = U^T U (the upper Cholesky factor of the inverse Hessian GPTQ walks along)."""
    if _last and _last[0][0] is hessian and _last[0][1] == group:
        return _last[0][2]
    inverse = np.linalg.inv(padded)
    inverse = (inverse + inverse.T) / 2
    factor = np.linalg.cholesky(inverse).T
    _last[:] = [(hessian, group, factor)]
    return factor


def gptq(weight: np.ndarray, hessian: np.ndarray, bits: int, group: int, symmetric: bool, *,
         estimate: bool = False, float_zero: bool = False,
         act_order: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """GPTQ of a [K, N] weight with the Hessian [K, K] of its input: integers [Kp, N] (int8 holding the signed
    values when symmetric, uint8 with zero points otherwise; Kp = K padded to whole groups, the padding
    quantizing zeros), scales [Kp/group, N] and zero points [Kp/group, N] (None when symmetric; float32 with
    ``float_zero``).  ``estimate``: each block's scale is fitted to its updated rows (``_scales``), weighted by the
    Hessian's diagonal, instead of taken from their extremes.  ``act_order``: rows in descending order of the
    Hessian's diagonal, block scales fixed beforehand."""
    if act_order:
        return _gptq_act_order(weight, hessian, bits, group, symmetric, estimate, float_zero)
    work, full = _padded(weight, hessian, group)
    factor = _upper_inverse_factor(hessian, full, group)
    cols, padded = work.shape
    blocks = padded // group
    ints = np.zeros((padded, cols), np.int16)
    scales = np.zeros((blocks, cols), np.float32)
    zeros = None if symmetric else np.zeros((blocks, cols), np.float32 if float_zero else np.uint8)
    importance = np.diag(full)
    low, high = (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1) if symmetric else (0, 2**bits - 1)
    step = max(group, _BLOCK // group * group)
    for start in range(0, padded, step):
        stop = min(start + step, padded)
        chunk = work[:, start:stop].copy()
        errors = np.zeros_like(chunk)
        local = factor[start:stop, start:stop]
        for i in range(stop - start):
            if i % group == 0:  # a new block: its scale from the rows as GPTQ has updated them so far
                scale, offset = _block_scale(chunk[:, i:i + group], importance[start + i:start + i + group], bits,
                                             symmetric, estimate, float_zero)
                safe = np.where(scale == 0, 1.0, scale)
                scales[(start + i) // group] = scale
                if zeros is not None:
                    zeros[(start + i) // group] = offset
            column = chunk[:, i]
            q = np.clip(np.rint(column / safe + offset), low, high)
            ints[start + i] = q
            error = (column - (q - offset) * scale) / local[i, i]
            chunk[:, i:] -= np.outer(error, local[i, i:])
            errors[:, i] = error
        work[:, stop:] -= errors @ factor[start:stop, stop:]
    return ints.astype(np.int8 if symmetric else np.uint8), scales, zeros


def _gptq_act_order(weight: np.ndarray, hessian: np.ndarray, bits: int, group: int, symmetric: bool,
                    estimate: bool, float_zero: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """``gptq`` with act-order and static groups (see the module's note)."""
    work, full = _padded(weight, hessian, group)
    cols, padded = work.shape
    blocks = padded // group
    importance = np.diag(full).copy()
    scales = np.zeros((blocks, cols), np.float32)
    zeros = None if symmetric else np.zeros((blocks, cols), np.float32 if float_zero else np.uint8)
    offsets = np.zeros((blocks, cols))
    for block in range(blocks):  # static groups: each block's scale from its rows before any update
        rows = slice(block * group, (block + 1) * group)
        scale, offset = _block_scale(work[:, rows], importance[rows], bits, symmetric, estimate, float_zero)
        scales[block], offsets[block] = scale, offset
        if zeros is not None:
            zeros[block] = offset
    order = np.argsort(-importance, kind="stable")
    work, permuted = work[:, order], full[np.ix_(order, order)]
    factor = np.linalg.cholesky((lambda inv: (inv + inv.T) / 2)(np.linalg.inv(permuted))).T
    ints = np.zeros((padded, cols), np.int16)
    low, high = (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1) if symmetric else (0, 2**bits - 1)
    used = scales.astype(np.float64)
    safe = np.where(used == 0, 1.0, used)
    for start in range(0, padded, _BLOCK):
        stop = min(start + _BLOCK, padded)
        chunk = work[:, start:stop].copy()
        errors = np.zeros_like(chunk)
        local = factor[start:stop, start:stop]
        for i in range(stop - start):
            block = order[start + i] // group
            column = chunk[:, i]
            q = np.clip(np.rint(column / safe[block] + offsets[block]), low, high)
            ints[order[start + i]] = q
            error = (column - (q - offsets[block]) * used[block]) / local[i, i]
            chunk[:, i:] -= np.outer(error, local[i, i:])
            errors[:, i] = error
        work[:, stop:] -= errors @ factor[start:stop, stop:]
    return ints.astype(np.int8 if symmetric else np.uint8), scales, zeros


def _block_scale(rows: np.ndarray, importance: np.ndarray, bits: int, symmetric: bool, estimate: bool,
                 float_zero: bool) -> tuple[np.ndarray, np.ndarray | float]:
    """One block's scale [N] and zero point ([N], 0.0 when symmetric) from its rows [N, group]."""
    if estimate or float_zero:
        _, scale, zero = fit_blocks(rows.T[None], importance[None, :, None], bits, symmetric, float_zero)
        return scale[0, 0].astype(np.float64), 0.0 if symmetric else zero[0, 0].astype(np.float64)
    _, scale, zero = block_quantize(rows.astype(np.float32), bits, symmetric)
    return scale[:, 0].astype(np.float64), 0.0 if zero is None else zero[:, 0].astype(np.float64)


def dequantize(ints: np.ndarray, scales: np.ndarray, zeros: np.ndarray | None, group: int, rows: int) -> np.ndarray:
    """The float [K, N] weight that integers [Kp, N], scales and zero points [Kp/group, N] stand for."""
    offset = 0 if zeros is None else np.repeat(zeros.astype(np.float32), group, axis=0)
    return ((ints.astype(np.float32) - offset) * np.repeat(scales, group, axis=0))[:rows]


def rtn_dequantized(weight: np.ndarray, bits: int, group: int, symmetric: bool) -> np.ndarray:
    """Round to nearest's float weight (blocks of ``group`` along K, zero-padded), for error measures."""
    rows, cols = weight.shape
    padded = np.pad(weight.astype(np.float32), ((0, -rows % group), (0, 0)))
    grouped = padded.reshape(-1, group, cols).transpose(0, 2, 1)
    q, scale, zero = block_quantize(grouped, bits, symmetric)
    values = (q.astype(np.float32) - (0 if zero is None else zero.astype(np.float32))) * scale
    return values.transpose(0, 2, 1).reshape(-1, cols)[:rows]


def output_error(weight: np.ndarray, approx: np.ndarray, hessian: np.ndarray) -> float:
    """Mean squared output error per calibration row, ``trace(D^T H D)`` with D = W - approx, summed over
    the N outputs."""
    delta = (weight.astype(np.float64) - approx.astype(np.float64))
    return float(np.einsum("kn,kn->", delta, hessian @ delta))


def int4_output_error(weight: np.ndarray, hessian: np.ndarray, group: int, symmetric: bool) -> float:
    """The sensitivity ``ratio_sensitivity: output_error`` ranks by: how much more output error int4 (round to
    nearest) adds than int8, ``trace(D4^T H D4) - trace(D8^T H D8)`` on the calibration inputs, with the full
    Hessian (``_data`` says why the default ranks by NNCF's max activation variance instead)."""
    return (output_error(weight, rtn_dequantized(weight, 4, group, symmetric), hessian)
            - output_error(weight, rtn_dequantized(weight, 8, group, symmetric), hessian))
