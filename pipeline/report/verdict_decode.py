"""Ranking a language model with a KV cache by decode (``qdeploy.pipeline.report.verdict`` uses these).

Generation time of such a model is dominated by its per-token decode steps, not by the one prefill call that the
plain latency row times: prefill is compute-bound (weight-only int4 is slower than float32 there) while decode is
memory-bound (int4 is faster).  So where every timed candidate on a target carries a decode record
(``BenchmarkRow.decode``), the target is ranked by decode ms per token, with the record's 95% interval
(``decode_ci95_ms``) as the noise rule, and its speedup is the decode speedup against the reference variant on the
same target.  The record has no per-round values: only the intervals can tell two artifacts apart.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from qdeploy.core.rows import BenchmarkRow
from qdeploy.core.values import is_finite_number
from qdeploy.pipeline.report.format import fmt_number, fmt_speedup

__all__ = [
    "DECODE_WHY",
    "decode_interval",
    "decode_ms",
    "decode_ratio",
    "decode_speedup_range",
    "ranks_by_decode",
    "slower_decode",
]

DECODE_WHY = ("ranked by decode ms per token: the model has a KV cache, so per-token decode, not the one prefill "
              "call, dominates generation time (prefill ms stays in the tables)")


def _record(row: BenchmarkRow | None) -> dict[str, Any]:
    return (row.decode or {}) if row is not None and row.status == "ok" else {}


def decode_ms(row: BenchmarkRow | None) -> float | None:
    """The row's decode ms per token; None without a decode record or a finite positive number."""
    value = _record(row).get("decode_ms_per_token")
    return float(value) if is_finite_number(value) and value > 0 else None


def decode_interval(row: BenchmarkRow | None) -> list[float] | None:
    """The 95% interval of the row's decode ms per token; None without both ends."""
    spread = _record(row).get("decode_ci95_ms") or []
    if len(spread) != 2 or not all(is_finite_number(v) for v in spread):
        return None
    return [float(spread[0]), float(spread[1])]


def ranks_by_decode(timed: Mapping[str, BenchmarkRow]) -> bool:
    """Every timed candidate row (``timed``: per variant its ok latency row at the ranked batch) has a decode
    record: the target ranks by decode.  One row without one (its decode failed) and the target keeps latency,
    since ranking some artifacts by prefill and others by decode would compare unlike numbers."""
    return bool(timed) and all(decode_ms(row) is not None for row in timed.values())


def _speedup(row: BenchmarkRow, reference: BenchmarkRow | None) -> float | None:
    """The reference's decode ms per token over this row's: the record's own (set by the report), else computed."""
    stored = _record(row).get("speedup")
    if is_finite_number(stored):
        return float(stored)
    mine, theirs = decode_ms(row), decode_ms(reference)
    return theirs / mine if mine and theirs else None


def decode_speedup_range(row: BenchmarkRow, reference: BenchmarkRow | None) -> list[float] | None:
    """The decode speedup's range from the two 95% intervals (lowest, highest ratio); None without both."""
    mine, theirs = decode_interval(row), decode_interval(reference)
    if mine is None or theirs is None or min(mine) <= 0:
        return None
    return [min(theirs) / max(mine), max(theirs) / min(mine)]


def decode_ratio(row: BenchmarkRow, reference: BenchmarkRow | None) -> tuple[float | None, list[float] | None]:
    """The decode speedup against the reference on the same target and its range: what a choice ranked by decode
    shows in place of the prefill speedup."""
    return _speedup(row, reference), decode_speedup_range(row, reference)


def slower_decode(variant: str, row: BenchmarkRow, reference_row: BenchmarkRow | None, reference: str | None) -> str:
    """A converted artifact whose decode the intervals say is slower than the float reference's on this target is
    never recommended there (as ``_slower_than_reference`` for latency); '' when it is not, or they cannot tell."""
    spread = decode_speedup_range(row, reference_row)
    ratio = _speedup(row, reference_row)
    if variant == reference or ratio is None or not spread or max(spread) >= 1.0:
        return ""
    return (f"slower than the float reference {reference or ''} on this target in decode ms per token: "
            f"{fmt_speedup(ratio, spread)} ({fmt_number(decode_ms(row))} against "
            f"{fmt_number(decode_ms(reference_row))} ms per token, the 95% intervals do not overlap); "
            "not recommended here").replace("  ", " ")
