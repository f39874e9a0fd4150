"""Range estimators: the clipping range [low, high] of a tensor from its calibration statistics.

Every estimator works on a ``TensorStats`` (the running minimum and maximum of a
tensor and, for the histogram methods, a histogram over [minimum, maximum]) and
returns ``(low, high)`` in float.  The quantizer turns that range into a scale
and zero point.

- ``minmax``: the observed extremes.
- ``percentile``: the p-th percentile of the values (both tails for signed data,
  the upper tail only for non-negative data such as ReLU outputs).
- ``entropy``: the threshold whose 8-bit quantization keeps the histogram
  closest in Kullback-Leibler divergence (TensorRT's calibration).
- ``mse``: the range that minimises the expected squared error of clipping plus
  rounding, over candidate ranges shrunk from the observed extremes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import numpy as np

__all__ = ["DEFAULT_BINS", "HISTOGRAM_METHODS", "METHODS", "Method", "TensorStats", "entropy_range", "estimate_range",
           "mse_range", "percentile_range"]

Method = Literal["minmax", "percentile", "entropy", "mse"]
METHODS: tuple[str, ...] = ("minmax", "percentile", "entropy", "mse")
HISTOGRAM_METHODS = frozenset({"percentile", "entropy", "mse"})
DEFAULT_BINS = 2048
_LEVELS = 256
_KL_THRESHOLDS = 192
"""Thresholds the entropy method tries (evenly spread over the histogram)."""


@dataclass
class TensorStats:
    """Running statistics of one float tensor over the calibration data."""

    minimum: float = np.inf
    maximum: float = -np.inf
    count: int = 0
    abs_max: float = 0.0
    histogram: np.ndarray | None = field(default=None, repr=False)
    """Counts over ``bins`` equal bins spanning [minimum, maximum]; set by a second pass."""
    zeros: int = 0
    """Exact zeros counted by the histogram pass (ReLU outputs hold many; any range represents them exactly)."""
    channel_peak: np.ndarray | None = field(default=None, repr=False)
    """Largest |value| per channel (axis 1), for the tensors asked per channel."""
    nonfinite: int = 0
    """+-Inf and NaN values seen (a mask added as -Inf): left out of the range, and counted."""

    def update_range(self, values: np.ndarray) -> None:
        finite = values[np.isfinite(values)] if not np.all(np.isfinite(values)) else values
        self.nonfinite += int(values.size - finite.size)
        if finite.size == 0:
            return
        low, high = float(finite.min()), float(finite.max())
        self.minimum, self.maximum = min(self.minimum, low), max(self.maximum, high)
        self.abs_max = max(self.abs_max, abs(low), abs(high))
        self.count += int(finite.size)

    def update_channel_peak(self, values: np.ndarray) -> None:
        """Fold in the largest finite |value| of each channel (axis 1) of ``values``."""
        if values.ndim < 2 or not values.size:
            return
        magnitudes = np.where(np.isfinite(values), np.abs(values), 0.0)
        peak = np.moveaxis(magnitudes, 1, 0).reshape(values.shape[1], -1).max(axis=1)
        if self.channel_peak is None:
            self.channel_peak = peak
        elif self.channel_peak.shape == peak.shape:
            self.channel_peak = np.maximum(self.channel_peak, peak)
        else:  # channels that change from sample to sample have no per-channel range (empty: none)
            self.channel_peak = np.zeros(0)

    def update_histogram(self, values: np.ndarray, bins: int = DEFAULT_BINS) -> None:
        """Add values to the histogram over the range the first pass found."""
        if self.count == 0 or self.maximum <= self.minimum:
            return  # a constant tensor: its range is exact without a histogram
        if self.histogram is None:
            self.histogram = np.zeros(bins, dtype=np.int64)
        counts, _ = np.histogram(values[np.isfinite(values)], bins=len(self.histogram),
                                 range=(self.minimum, self.maximum))
        self.histogram += counts
        self.zeros += int(np.count_nonzero(values == 0))

    @property
    def edges(self) -> np.ndarray:
        assert self.histogram is not None
        return np.linspace(self.minimum, self.maximum, len(self.histogram) + 1)


def estimate_range(stats: TensorStats, method: str, *, percentile: float = 99.999) -> tuple[float, float]:
    """The clipping range of a tensor by the named method; minmax when there is no histogram."""
    if stats.count == 0:
        return 0.0, 0.0
    if method == "minmax" or stats.histogram is None or stats.maximum <= stats.minimum:
        return float(stats.minimum), float(stats.maximum)
    if method == "percentile":
        return percentile_range(stats, percentile)
    if method == "entropy":
        return entropy_range(stats)
    if method == "mse":
        return mse_range(stats)
    raise ValueError(f"unknown range estimator '{method}'; known: {', '.join(METHODS)}")


def _quantile(stats: TensorStats, fraction: float) -> float:
    """Value below which ``fraction`` of the samples lie, interpolated linearly inside a bin."""
    assert stats.histogram is not None
    cumulative = np.cumsum(stats.histogram, dtype=np.float64)
    target = fraction * cumulative[-1]
    index = int(np.searchsorted(cumulative, target, side="left"))
    index = min(index, len(cumulative) - 1)
    before = cumulative[index - 1] if index > 0 else 0.0
    inside = (target - before) / max(stats.histogram[index], 1)
    edges = stats.edges
    return float(edges[index] + np.clip(inside, 0.0, 1.0) * (edges[index + 1] - edges[index]))


def percentile_range(stats: TensorStats, percentile: float) -> tuple[float, float]:
    """Both tails cut at the percentile for signed data; only the upper tail for non-negative data."""
    upper_fraction = percentile / 100.0
    high = _quantile(stats, upper_fraction)
    low = stats.minimum if stats.minimum >= 0 else _quantile(stats, 1.0 - upper_fraction)
    return float(low), float(max(high, low))


def _magnitude_histogram(stats: TensorStats) -> tuple[np.ndarray, np.ndarray]:
    """Counts of |x| over [0, abs_max] in as many bins as the histogram (bin centers folded over zero)."""
    assert stats.histogram is not None
    edges = stats.edges
    centers = np.abs((edges[:-1] + edges[1:]) / 2)
    top = max(abs(stats.minimum), abs(stats.maximum))
    bins = len(stats.histogram)
    index = np.minimum((centers / top * bins).astype(np.int64), bins - 1)
    folded = np.bincount(index, weights=stats.histogram, minlength=bins)
    return folded, np.linspace(0.0, top, bins + 1)


def entropy_range(stats: TensorStats) -> tuple[float, float]:
    """TensorRT's KL-divergence threshold on |x|; the range is cut symmetrically at that threshold.

    One-sided data (ReLU outputs) gets all 256 levels below the threshold, signed data 128 on each side.
    """
    counts, edges = _magnitude_histogram(stats)
    counts[0] = max(counts[0] - stats.zeros, 0)  # exact zeros would pull the threshold toward zero
    threshold_bin = _kl_threshold_bin(counts, _LEVELS if stats.minimum >= 0 else _LEVELS // 2)
    threshold = float(edges[threshold_bin])
    low = stats.minimum if stats.minimum >= 0 else max(stats.minimum, -threshold)
    return float(low), float(max(min(stats.maximum, threshold), low))


def _kl_threshold_bin(counts: np.ndarray, quantized_bins: int) -> int:
    """The histogram index whose clipped-and-quantized distribution diverges least from the original."""
    bins = len(counts)
    if bins <= quantized_bins:
        return bins
    counts = counts.astype(np.float64)
    tail = np.concatenate([np.cumsum(counts[::-1])[::-1], [0.0]])  # tail[i] = sum(counts[i:])
    best_index, best_divergence = bins, np.inf
    for index in range(quantized_bins, bins + 1, max(1, (bins - quantized_bins) // _KL_THRESHOLDS)):
        reference = counts[:index].copy()
        reference[-1] += tail[index]
        divergence = _kl_divergence(reference, _quantize_distribution(counts[:index], quantized_bins))
        if divergence < best_divergence:
            best_index, best_divergence = index, divergence
    return best_index


def _quantize_distribution(counts: np.ndarray, quantized_bins: int) -> np.ndarray:
    """Merge counts into quantized_bins groups, then spread each group evenly over its non-empty bins."""
    starts = np.linspace(0, len(counts), quantized_bins + 1).astype(np.int64)[:-1]
    sums = np.add.reduceat(counts, starts)
    nonzero = counts > 0
    filled = np.add.reduceat(nonzero.astype(np.float64), starts)
    share = np.divide(sums, filled, out=np.zeros_like(sums), where=filled > 0)
    lengths = np.diff(np.append(starts, len(counts)))
    return np.where(nonzero, np.repeat(share, lengths), 0.0)


def _kl_divergence(reference: np.ndarray, candidate: np.ndarray, epsilon: float = 1e-4) -> float:
    """KL(p || q) with q smoothed: empty bins of q borrow epsilon from the others (as ONNX Runtime does)."""
    p = reference / max(reference.sum(), 1e-12)
    q = candidate / max(candidate.sum(), 1e-12)
    empty = q == 0
    if empty.all():
        return np.inf
    if empty.any():
        q = np.where(empty, epsilon, q - epsilon * empty.sum() / (~empty).sum())
        if np.any(q <= 0):
            return np.inf
    mask = p > 0
    return float(np.sum(p[mask] * np.log(p[mask] / q[mask])))


def mse_range(stats: TensorStats, candidates: int = 100) -> tuple[float, float]:
    """The shrunk range with the least expected squared error (clipping outside, rounding inside)."""
    assert stats.histogram is not None
    edges = stats.edges
    centers = (edges[:-1] + edges[1:]) / 2
    weights = stats.histogram.astype(np.float64)
    best, best_error = (float(stats.minimum), float(stats.maximum)), np.inf
    for fraction in np.linspace(1.0 / candidates, 1.0, candidates):
        low, high = _shrunk(stats.minimum, stats.maximum, fraction)
        step = max(high - low, 1e-12) / (_LEVELS - 1)
        clipped = np.clip(centers, low, high)
        error = np.sum(weights * ((centers - clipped) ** 2 + step * step / 12.0))
        if error < best_error:
            best, best_error = (float(low), float(high)), error
    return best


def _shrunk(minimum: float, maximum: float, fraction: float) -> tuple[float, float]:
    """The range scaled toward zero (signed data) or toward its minimum (one-sided data)."""
    if minimum >= 0:
        return minimum, minimum + (maximum - minimum) * fraction
    if maximum <= 0:
        return maximum + (minimum - maximum) * fraction, maximum
    return minimum * fraction, maximum * fraction
