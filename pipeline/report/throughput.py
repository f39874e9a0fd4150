"""Throughput rows in the report: their ratio to the reference, taken as latency speedups are (per round)."""

from __future__ import annotations

import statistics

from qdeploy.core.rows import ThroughputRow

__all__ = ["throughput_speedup"]


def throughput_speedup(rows: list[ThroughputRow], row: ThroughputRow,
                       reference: str) -> tuple[float | None, list[float] | None]:
    """(median, [lowest, highest]) of the per-round ratios of the row's inferences/s to the reference's on the
    same target and batch; rounds are interleaved, so drift of the machine hits both alike."""
    ref = next((other for other in rows if other.variant == reference and other.target == row.target
                and other.batch_size == row.batch_size), None)
    if ref is None or row.status != "ok" or ref.status != "ok":
        return None, None
    anchor = row.anchor or {}
    if anchor.get("variant") == ref.variant and anchor.get("round_inferences_per_s"):  # ref timed again beside it
        ratios = [mine / theirs for mine, theirs in zip(row.round_inferences_per_s, anchor["round_inferences_per_s"],
                                                         strict=False) if theirs > 0]
    elif row.round_group == ref.round_group:
        ratios = [mine / theirs for mine, theirs in zip(row.round_inferences_per_s, ref.round_inferences_per_s,
                                                         strict=False) if theirs > 0]
    else:  # timed in different groups: no round is shared, their medians compare
        mine, theirs = (statistics.median(r.round_inferences_per_s) if r.round_inferences_per_s else None
                        for r in (row, ref))
        ratios = [mine / theirs] if mine and theirs else []
    if not ratios:
        return None, None
    return statistics.median(ratios), [min(ratios), max(ratios)]
