"""Block quantization of one 2-D weight for weight-only int4/int8, in bounded memory.

Two layouts of the same kind of values:

- ``matmulnbits_tensors``: ONNX Runtime's ``com.microsoft.MatMulNBits`` layout (packed ``[N, K/group,
  group*bits/8]``, scales ``[N * K/group]``, zero points packed per column), written by ORT's own C++ block
  quantizers (``quantize_matmul_4bits/8bits``, what ORT's ``MatMulNBitsQuantizer`` calls), so the values match
  ORT's tool bit for bit;
- ``grouped_tensors``: ONNX's blocked ``DequantizeLinear`` (opset 21: int4/uint4/int8/uint8 values, a scale per
  block along one axis) and ``GatherBlockQuantized`` tables, quantized here with the same rule as ORT's MLAS
  (``block_quantize``).

Both work in slices (columns for MatMulNBits, rows otherwise) of at most ``SLICE_BYTES`` float bytes, so a
weight memory-mapped from its data file is never copied whole.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

__all__ = ["MATMULNBITS_MAX_BLOCK", "MIN_BLOCK", "SLICE_BYTES", "block_quantize", "dividing_block", "grouped_tensors",
           "matmulnbits_tensors", "pack_int4", "packed_matmulnbits"]

SLICE_BYTES = 64 << 20
"""Float bytes quantized per slice: bounds the anonymous memory of one weight's quantization."""


def _column_slices(rows: int, cols: int) -> Iterator[tuple[int, int]]:
    step = max(1, SLICE_BYTES // (4 * rows))
    for start in range(0, cols, step):
        yield start, min(cols, start + step)


def matmulnbits_tensors(weight: np.ndarray, bits: int, group: int, symmetric: bool
                        ) -> tuple[list[bytes], bytes, bytes | None]:
    """MatMulNBits' packed weight (in column slices: the layout is per output column, so they concatenate),
    scales and zero points (None when symmetric) of a [K, N] weight."""
    from onnxruntime.capi._pybind_state import quantize_matmul_4bits, quantize_matmul_8bits

    kernel = quantize_matmul_4bits if bits == 4 else quantize_matmul_8bits
    rows, cols = weight.shape
    blocks = (rows + group - 1) // group
    blob = group * bits // 8
    zp_per_col = (blocks * bits + 7) // 8
    packed_parts, scale_parts, zp_parts = [], [], []
    for start, stop in _column_slices(rows, cols):
        piece = np.ascontiguousarray(weight[:, start:stop], dtype=np.float32)
        if rows % group:
            piece = np.pad(piece, ((0, blocks * group - rows), (0, 0)))
        width = stop - start
        packed = np.zeros((width, blocks, blob), np.uint8)
        scales = np.zeros((width, blocks), np.float32)
        zero_points = np.zeros((width, zp_per_col), np.uint8)
        kernel(packed, piece, scales, zero_points, group, width, blocks * group, symmetric)
        packed_parts.append(packed.tobytes())
        scale_parts.append(scales.tobytes())
        zp_parts.append(zero_points.tobytes())
    return packed_parts, b"".join(scale_parts), None if symmetric else b"".join(zp_parts)


def block_quantize(data: np.ndarray, bits: int, symmetric: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Quantize groups along the last axis of ``data`` [..., group]: (integers, scales, zero points).

    Symmetric, as ORT's MLAS block quantizer: the value of largest magnitude (with its sign) maps to -2^(bits-1),
    so scale = that value / -2^(bits-1) (it may be negative) and all 2^bits levels are used.  Asymmetric: unsigned
    over [min(w, 0), max(w, 0)] with a zero point per group, as ORT's too.
    """
    data = data.astype(np.float32, copy=False)
    if symmetric:
        low = -(2 ** (bits - 1))
        top = data.max(axis=-1, keepdims=True)
        bottom = data.min(axis=-1, keepdims=True)
        extreme = np.where(np.abs(top) > np.abs(bottom), top, bottom)
        scale = (extreme / low).astype(np.float32)
        safe = np.where(scale == 0, 1.0, scale).astype(np.float32)
        return np.clip(np.rint(data / safe), low, -low - 1).astype(np.int8), scale, None
    top = 2**bits - 1
    low = np.minimum(data.min(axis=-1, keepdims=True), 0)
    high = np.maximum(data.max(axis=-1, keepdims=True), 0)
    scale = ((high - low) / top).astype(np.float32)
    safe = np.where(scale == 0, 1.0, scale).astype(np.float32)
    zero = np.clip(np.rint(-low / safe), 0, top).astype(np.uint8)
    return np.clip(np.rint(data / safe) + zero, 0, top).astype(np.uint8), scale, zero


MIN_BLOCK = 16
"""Smallest block MatMulNBits and GatherBlockQuantized take (a power of two)."""
MATMULNBITS_MAX_BLOCK = 256
"""Largest block ONNX Runtime's MLAS block quantizer writes for MatMulNBits (16 to 256; a larger one fails inside
``MlasQuantizeBlockwise``)."""


def dividing_block(length: int, wanted: int, largest: int | None = None) -> int | None:
    """The largest power of two from ``MIN_BLOCK`` up to ``wanted`` (and ``largest``) that divides ``length``;
    None when none does.  OpenVINO's ONNX reader refuses blocked weights (MatMulNBits' K, GatherBlockQuantized's
    quantized axis, a blocked DequantizeLinear's axis) that are not a multiple of their block size; ONNX Runtime
    pads them (NNCF's ``group_size_fallback_mode: adjust`` searches the same way)."""
    top = min(wanted, largest) if largest else wanted
    block = 1 << (max(top, 1).bit_length() - 1)  # the largest power of two <= top
    while block >= MIN_BLOCK:
        if length % block == 0:
            return block
        block //= 2
    return None


def pack_int4(values: np.ndarray) -> bytes:
    """Two 4-bit values per byte, the first in the low nibble (ONNX's int4/uint4 layout)."""
    flat = values.reshape(-1).astype(np.uint8) & 0x0F
    if flat.size % 2:
        flat = np.append(flat, np.uint8(0))
    return (flat[0::2] | (flat[1::2] << 4)).tobytes()


def _row_slices(rows: int, row_bytes: int, multiple: int) -> Iterator[tuple[int, int]]:
    step = max(multiple, SLICE_BYTES // max(row_bytes, 1) // multiple * multiple)
    for start in range(0, rows, step):
        yield start, min(rows, start + step)


def grouped_tensors(weight: np.ndarray, axis: int, bits: int, group: int, symmetric: bool
                    ) -> tuple[list[bytes], list[bytes], list[bytes] | None]:
    """Blocked quantization of a 2-D weight along ``axis`` (0: a MatMul's K, 1: an embedding's hidden), in row
    slices: the integer bytes (int4 packed), scales [ceil(K/g), N] or [V, ceil(H/g)], and zero points alike.
    A last partial group is padded with zeros for its scale (ONNX's blocked DequantizeLinear allows it)."""
    rows, cols = weight.shape
    values, scales, zeros = [], [], []
    multiple = 2 * group if axis == 0 else 2  # int4 packing of values and zero points stays byte-aligned per slice
    for start, stop in _row_slices(rows, cols * 4, multiple):
        piece = np.asarray(weight[start:stop], dtype=np.float32)
        height = stop - start
        if axis == 0:  # groups run down the columns: [K/g, g, N] -> group axis last
            padded = np.pad(piece, ((0, -height % group), (0, 0)))
            grouped = padded.reshape(-1, group, cols).transpose(0, 2, 1)
        else:
            padded = np.pad(piece, ((0, 0), (0, -cols % group)))
            grouped = padded.reshape(height, -1, group)
        q, scale, zero = block_quantize(grouped, bits, symmetric)
        q = q.transpose(0, 2, 1).reshape(-1, cols)[:height] if axis == 0 else q.reshape(height, -1)[:, :cols]
        scale, zero = scale[..., 0], None if zero is None else zero[..., 0]
        values.append(pack_int4(q) if bits == 4 else q.tobytes())
        scales.append(np.ascontiguousarray(scale).tobytes())
        if zero is not None:
            zeros.append(pack_int4(zero) if bits == 4 else np.ascontiguousarray(zero).tobytes())
    return values, scales, None if symmetric else zeros


def packed_matmulnbits(ints: np.ndarray, scales: np.ndarray, zeros: np.ndarray | None, bits: int, group: int
                       ) -> tuple[list[bytes], bytes, bytes | None]:
    """MatMulNBits' tensors from integers already chosen (GPTQ, scale estimation): ``ints`` [Kp, N] with K padded to
    whole groups (signed when ``zeros`` is None, stored with the implicit zero point 2^(bits-1) as ORT's symmetric
    kernels write them), scales and zero points [Kp/group, N] (integers, or float32 ones stored as the scales
    are).  Same layout as ``matmulnbits_tensors``."""
    blocks = ints.shape[0] // group
    stored = ints.astype(np.int16) + (2 ** (bits - 1) if zeros is None else 0)
    per_column = np.ascontiguousarray(stored.T.astype(np.uint8))  # [N, Kp]: a column's blocks follow each other
    packed = pack_int4(per_column) if bits == 4 else per_column.tobytes()
    scale_bytes = np.ascontiguousarray(scales.T, dtype=np.float32).tobytes()
    if zeros is None:
        return [packed], scale_bytes, None
    if zeros.dtype.kind == "f":  # float zero points: one float32 per block, laid out as the scales
        return [packed], scale_bytes, np.ascontiguousarray(zeros.T, dtype=np.float32).tobytes()
    by_column = np.ascontiguousarray(zeros.T)  # [N, blocks]; 4-bit: each column's row padded to whole bytes
    if bits == 4:
        by_column = np.pad(by_column, ((0, 0), (0, blocks % 2)))
        return [packed], scale_bytes, pack_int4(by_column)
    return [packed], scale_bytes, by_column.tobytes()
