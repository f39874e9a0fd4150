"""The part of an output that its whole-output metrics cannot see.

A detector's output often joins boxes (hundreds of pixels) and class scores (0..1) on one axis: its cosine and SNR
are the boxes', so scores rounded to nothing by int8 still read cosine 0.996 (YOLOv8n, docs/validate.md).  Along
an output's channel axes (up to 1,024 slices), when the slices whose RMS is under 1% of the largest's form one
block beside the others, that block is compared on its own, and ``small_part_note`` says so when it misses the SNR
limit that the whole output meets.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from qdeploy.core.lm_metrics import is_token_scores

if TYPE_CHECKING:
    from qdeploy.core.tolerance import Tolerance

__all__ = ["SMALL_PART_RATIO", "SNR_CAP_DB", "small_part_note", "snr_db"]

SNR_CAP_DB = 200.0
SMALL_PART_RATIO = 0.01
"""Slices of an output axis whose RMS is under this share of the largest slice's are its small part."""
_MAX_PART_AXIS = 1024


def snr_db(signal: float, noise: float) -> float:
    """10 log10(signal / noise) from sums of squares, within +-SNR_CAP_DB (identical outputs read the cap)."""
    if noise == 0.0:
        return SNR_CAP_DB
    if signal == 0.0:
        return -SNR_CAP_DB
    return float(np.clip(10.0 * math.log10(signal / noise), -SNR_CAP_DB, SNR_CAP_DB))


def small_part_note(name: str, refs: Sequence[Any], cands: Sequence[Any], tolerance: Tolerance) -> str | None:
    """A note when a float output joins parts of very different scale along an axis (a detector's boxes in
    hundreds beside its class scores in 0..1) and the small part misses the SNR limit that the whole output, whose
    cosine and SNR the large part dominates, meets: the whole-output metrics cannot see it.  None otherwise."""
    limit = tolerance.snr_db_min
    try:
        shapes = {np.shape(ref) for ref in refs} | {np.shape(cand) for cand in cands}
        first = np.asarray(refs[0])
    except Exception:  # a missing sample or a non-array: the structure check already reports it
        return None
    if limit is None or len(shapes) != 1 or first.ndim < 2 or not np.issubdtype(first.dtype, np.floating):
        return None
    if is_token_scores(name, first.shape, first.dtype):  # token positions are places, and logits spill to disk:
        return None  # a second pass over them would read every sample again for no part to find
    for axis in _channel_axes(first.ndim):
        if not 2 <= first.shape[axis] <= _MAX_PART_AXIS:
            continue
        signal, noise = _slice_energies(refs, cands, axis)
        rms = np.sqrt(signal)
        small = rms < SMALL_PART_RATIO * rms.max()
        if not (_one_block(small) and np.isfinite(noise).all() and (rms[small] > 0).all()):
            continue
        part_snr = snr_db(float(signal[small].sum()), float(noise[small].sum()))
        whole_snr = snr_db(float(signal.sum()), float(noise.sum()))
        if part_snr < limit <= whole_snr:
            indices = np.flatnonzero(small)
            return (f"output '{name}': {indices.size} of {small.size} slices along axis {axis} (indices "
                    f"{_ranges(indices)}) are under {SMALL_PART_RATIO:g}x the scale of the largest and agree at SNR "
                    f"{part_snr:.1f} dB, under snr_db_min {limit:g}, while the whole output reads {whole_snr:.1f} "
                    "dB: its cosine and SNR are the large part's; compare that part on its own (a task metric, or "
                    "the model's outputs split)")
    return None


def _channel_axes(ndim: int) -> range:
    """Axes that hold parts: an image-like output's channels only ([N, C, H, W]: its rows and columns are places,
    and a quiet background is no part); every non-batch axis of [N, C] and [N, boxes, fields]."""
    return range(1, 2) if ndim >= 4 else range(1, ndim)


def _one_block(small: np.ndarray) -> bool:
    """The small slices are one contiguous block and the others too (boxes 0-3, scores 4-83): scattered small slices
    are rare classes of a softmax, not a part."""
    if not small.any() or small.all():
        return False
    return int(np.count_nonzero(np.diff(small.astype(np.int8)))) == 1


def _slice_energies(refs: Sequence[Any], cands: Sequence[Any], axis: int) -> tuple[np.ndarray, np.ndarray]:
    """Per slice along ``axis``: the reference's mean square and the error's, over every sample."""
    signal = noise = None
    for ref_array, cand_array in zip(refs, cands, strict=True):
        ref = np.moveaxis(np.asarray(ref_array, dtype=np.float64), axis, 0)
        ref = ref.reshape(ref.shape[0], -1)
        cand = np.moveaxis(np.asarray(cand_array, dtype=np.float64), axis, 0).reshape(ref.shape)
        ref_sq, err_sq = np.mean(ref * ref, axis=1), np.mean((cand - ref) ** 2, axis=1)
        signal = ref_sq if signal is None else signal + ref_sq
        noise = err_sq if noise is None else noise + err_sq
    return signal, noise


def _ranges(indices: np.ndarray) -> str:
    """0,1,2,5 -> '0-2, 5' (the first four runs)."""
    runs: list[list[int]] = []
    for index in indices.tolist():
        if runs and index == runs[-1][1] + 1:
            runs[-1][1] = index
        else:
            runs.append([index, index])
    text = ", ".join(f"{a}-{b}" if a != b else f"{a}" for a, b in runs[:4])
    return text + (" ..." if len(runs) > 4 else "")
