"""Range estimators on distributions whose right answer is known."""

from __future__ import annotations

import numpy as np
import pytest

from qdeploy.calibration.ranges import TensorStats, estimate_range


def stats_of(*chunks: np.ndarray) -> TensorStats:
    """Two passes as the calibration runs them: ranges first, then histograms over the final range."""
    stats = TensorStats()
    for chunk in chunks:
        stats.update_range(chunk)
    for chunk in chunks:
        stats.update_histogram(chunk)
    return stats


def gaussian_with_outliers(seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.concatenate([rng.standard_normal(200_000), [40.0, -35.0]]).astype(np.float32)


def test_minmax_is_the_observed_extremes_over_every_chunk() -> None:
    stats = stats_of(np.array([0.5, -2.0], np.float32), np.array([3.0, 1.0], np.float32))
    assert estimate_range(stats, "minmax") == (-2.0, 3.0)
    assert stats.abs_max == 3.0 and stats.count == 4


def test_non_finite_values_are_ignored() -> None:
    stats = stats_of(np.array([1.0, np.nan, -1.0, np.inf], np.float32))
    assert estimate_range(stats, "minmax") == (-1.0, 1.0)


def test_percentile_cuts_both_tails_of_signed_data() -> None:
    low, high = estimate_range(stats_of(gaussian_with_outliers()), "percentile", percentile=99.9)
    assert -3.6 < low < -3.0 and 3.0 < high < 3.6  # the 0.1% tails of a standard normal are at +-3.29


def test_percentile_keeps_the_lower_end_of_non_negative_data() -> None:
    relu = np.maximum(gaussian_with_outliers(), 0)
    low, high = estimate_range(stats_of(relu), "percentile", percentile=99.0)
    assert low == 0.0 and 2.0 < high < 2.6  # upper 1% of a half-normal with half its mass at zero: ~2.33


def test_entropy_clips_outliers_symmetrically() -> None:
    low, high = estimate_range(stats_of(gaussian_with_outliers()), "entropy")
    assert low == -high and 2.5 < high < 6.0


def test_entropy_ignores_the_mass_of_exact_zeros_of_relu_outputs() -> None:
    relu = np.maximum(gaussian_with_outliers(1), 0)
    low, high = estimate_range(stats_of(relu), "entropy")
    assert low == 0.0 and high > 2.5  # without discounting the zeros the threshold collapses toward 1.5


def test_mse_keeps_rare_large_outliers_when_clipping_them_costs_more() -> None:
    data = gaussian_with_outliers()
    low, high = estimate_range(stats_of(data), "mse")
    assert high - low > 40.0


def test_mse_clips_a_heavy_uniform_tail() -> None:
    rng = np.random.default_rng(2)
    data = np.concatenate([rng.standard_normal(200_000), rng.uniform(-30, 30, 20)]).astype(np.float32)
    low, high = estimate_range(stats_of(data), "mse")
    assert high < 29 and low > -29  # twenty points spread out: a narrower range rounds the rest finer


@pytest.mark.parametrize("method", ["minmax", "percentile", "entropy", "mse"])
def test_constant_and_empty_tensors_give_a_range(method: str) -> None:
    assert estimate_range(stats_of(np.full(10, 2.5, np.float32)), method) == (2.5, 2.5)
    assert estimate_range(TensorStats(), method) == (0.0, 0.0)


def test_unknown_method_is_refused() -> None:
    with pytest.raises(ValueError, match="known: minmax, percentile, entropy, mse"):
        estimate_range(stats_of(gaussian_with_outliers()), "kl")
