"""Speedups of artifacts timed in different session groups (``round_group``): no round is shared, so no round is
paired; the medians and their intervals say it."""

from __future__ import annotations

import pytest

from qdeploy.core.ranking import rank_test_apart
from qdeploy.core.rows import BenchmarkRow, LatencyStats
from qdeploy.pipeline.results.gates import speedup
from qdeploy.pipeline.results.summary import speedup_range


def _row(variant: str, rounds: list[float], interval: list[float], group: int | None) -> BenchmarkRow:
    p50 = sorted(rounds)[len(rounds) // 2]
    stats = LatencyStats(p50=p50, p90=max(rounds), p99=max(rounds), mean=p50, min=min(rounds), max=max(rounds),
                         ci95_p50=interval)
    return BenchmarkRow(variant=variant, target="openvino:cpu", batch_size=1, status="ok", latency_ms=stats,
                        round_p50_ms=rounds, round_group=group)


def test_speedup_across_groups_is_the_ratio_of_medians_and_its_range_the_intervals() -> None:
    reference = _row("fp32", [3.0, 2.9, 3.1, 3.0, 3.2, 2.8], [2.9, 3.1], 0)
    int8 = _row("int8", [1.5, 1.6, 4.0], [1.5, 4.0], 1)  # timed alone, one slow round
    rows = [reference, int8]
    assert speedup(rows, "int8", "openvino:cpu", 1, "fp32") == pytest.approx(3.0 / 1.6)
    assert speedup_range(rows, int8, "fp32") == pytest.approx([2.9 / 4.0, 3.1 / 1.5])
    together = [reference.replace(round_group=None), int8.replace(round_group=None)]  # the same rounds: paired
    assert speedup(together, "int8", "openvino:cpu", 1, "fp32") == pytest.approx(2.9 / 1.6)  # median of 3 ratios
    assert speedup_range(together, together[1], "fp32") == pytest.approx([3.1 / 4.0, 3.0 / 1.5])


def test_the_rank_test_holds_its_level_and_needs_three_rounds_a_side() -> None:
    assert rank_test_apart([3.0, 3.1, 3.2], [1.0, 1.1, 1.2])  # every round higher: p = 1/20
    assert not rank_test_apart([3.0, 3.1], [1.0, 1.1, 1.2])
    assert not rank_test_apart([1.0, 2.0, 3.0, 4.0], [1.5, 2.5, 3.5, 4.5])
    assert not rank_test_apart([1.0, 1.0, 1.0], [1.0, 1.0, 1.0])  # ties count half: never apart


def test_a_later_group_pairs_with_the_reference_timed_again_beside_it() -> None:
    """luscinia: fp32 timed while the machine was busy, int8 (the same float32 graph) minutes later when it was
    quiet: "1.83x" from the medians.  Beside int8, fp32 was timed again (``anchor``): the paired ratio is ~1."""
    reference = _row("fp32", [1.9, 1.85, 1.95, 1.88, 1.92], [1.85, 1.95], 0)
    int8 = _row("int8", [1.03, 1.0, 1.05, 1.02, 1.04], [1.0, 1.05], 1).replace(
        anchor={"variant": "fp32", "round_p50_ms": [1.04, 1.01, 1.05, 1.01, 1.03]})
    rows = [reference, int8]

    assert speedup(rows, "int8", "openvino:cpu", 1, "fp32") == pytest.approx(1.01, abs=0.011)
    assert speedup_range(rows, int8, "fp32") == pytest.approx([0.99, 1.01], abs=0.011)
    assert speedup(rows, "int8", "openvino:cpu", 1, "fp16") is None  # the anchor pairs only with itself
