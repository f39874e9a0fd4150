"""What the verdict ranks a latency (throughput) row by: its milliseconds (inferences/s), or, on a target timed in
groups, its time (rate) over the anchor's in the same rounds.

A large model's artifacts may not all fit in memory at once: the benchmark times them group after group, the
first artifact again in every group (``stages.benchmark._resident``).  Medians taken minutes apart on a shared
machine differ by its drift, not by the artifacts: luscinia's int8 (the same float32 graph: nothing quantizable)
came out "1.83x" faster than fp32 from a later, quieter group, and the verdict shipped it.  Divided round by round
by the anchor's time in those rounds, every row is in the same unit: rows of one group keep their order (one
anchor), rows of two groups compare without the drift.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping

from qdeploy.core.rows import BenchmarkRow, ThroughputRow

__all__ = ["anchored_latency", "anchored_throughput", "relative_words"]


def anchored_latency(bench: BenchmarkRow, rows: Mapping[str, BenchmarkRow]
                     ) -> tuple[float, list[float], list[float] | None]:
    """(score, per-round scores, 95% interval of the score) of ``bench`` among ``rows`` (one target and batch):
    milliseconds, or ratios to the anchor's rounds where every grouped row has them."""
    interval = bench.latency_ms.ci95_p50 if bench.latency_ms else None
    raw = (float(bench.p50 or 0.0), [float(v) for v in bench.round_p50_ms], list(interval) if interval else None)
    rounds = _anchor_rounds(rows, "round_p50_ms")
    if rounds is None or bench.variant not in rounds:
        return raw
    mine = rounds[bench.variant]
    middle = statistics.median(mine)
    scores = [value / anchor for value, anchor in zip(bench.round_p50_ms, mine, strict=False) if anchor > 0]
    return (raw[0] / middle, scores, [bound / middle for bound in raw[2]] if raw[2] else None)


def anchored_throughput(rate: ThroughputRow, rows: Mapping[str, ThroughputRow]
                        ) -> tuple[float, list[float], list[float] | None]:
    """As ``anchored_latency`` for throughput (lower is better: inferences/s negated), its interval the rounds'
    range."""
    values = [float(v) for v in rate.round_inferences_per_s]
    rounds = _anchor_rounds(rows, "round_inferences_per_s")
    score = -float(rate.inferences_per_s or 0.0)
    if rounds is not None and rate.variant in rounds:
        mine = rounds[rate.variant]
        score /= statistics.median(mine)
        values = [value / anchor for value, anchor in zip(values, mine, strict=False) if anchor > 0]
    scores = [-value for value in values]
    return score, scores, [min(scores), max(scores)] if scores else None


def relative_words(score: float, shown: float | None, by: str) -> str:
    """What the verdict compared where it ranked by the anchor (``score`` is then not the ``shown`` ms or rate):
    ", 1.09x the first artifact's time in its own rounds"; "" otherwise.  A later group's 0.27 ms is slower than
    an earlier group's 0.41 ms when the first artifact took 0.25 ms beside the one and 0.45 ms beside the other."""
    value = -score if by == "throughput" else score
    if shown is None or by not in ("latency", "throughput") or math.isclose(value, shown):
        return ""
    return f", {value:.2f}x the first artifact's {'rate' if by == 'throughput' else 'time'} in its own rounds"


def _anchor_rounds(rows: Mapping[str, BenchmarkRow] | Mapping[str, ThroughputRow],
                   key: str) -> dict[str, list[float]] | None:
    """Per variant, the anchor's per-round values (``key``) in its group; None unless every grouped ok row has
    them."""
    grouped = [row for row in rows.values() if row.round_group is not None and row.status == "ok"]
    named = {row.anchor["variant"] for row in grouped if row.anchor}
    if len(named) != 1:
        return None
    anchor = rows.get(named.pop())
    found: dict[str, list[float]] = {}
    for row in grouped:
        if row.anchor:
            found[row.variant] = list(row.anchor.get(key) or [])
        elif anchor is not None and anchor.status == "ok" and row.round_group == anchor.round_group:
            found[row.variant] = list(getattr(anchor, key))
        else:
            return None  # a row timed without the anchor: one unit for all, or none
    return found if all(found.values()) else None
