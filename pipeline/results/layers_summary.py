"""One (variant, target)'s layer rows summed up for a deployer: the share of compute (MACs) and of measured time
that ran in each precision, the layers that cost most time and add most error, why compute nodes of a reduced
artifact ran in float, and, for an int8 artifact that is not faster than expected, the reason named."""

from __future__ import annotations

from collections import Counter
from typing import TypedDict

from qdeploy.core.layer_rows import LayerRow
from qdeploy.pipeline.report.format import fmt_number
from qdeploy.pipeline.report.layers import by_error, by_time
from qdeploy.targets.layer_profile import LayerTimeDict

__all__ = ["EXPECTED_INT8_SPEEDUP", "LAYOUT_OPS", "TOP", "LayerGraphFacts", "PairSummaryDict", "PrecisionShare",
           "ProfiledLayerRow", "SlowInt8Diagnosis", "TimelineColumns", "float_reason", "pair_summary", "timeline",
           "top_rows"]

TOP = 10
EXPECTED_INT8_SPEEDUP = 1.2
"""An int8 artifact timed at less than this over the float reference on a target is slower than expected."""
LAYOUT_OPS = frozenset({"Reorder", "ReorderInput", "ReorderOutput", "Transpose"})
QDQ_OPS = frozenset({"QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear"})
_NAMING_SHARE = 0.10
"""A cause of slow int8 is named when it takes at least this share of the time (or of the MACs)."""
FLOAT = ("f32", "f16", "bf16", "f64")


class _ProfiledKeys(LayerTimeDict):
    """``qdeploy.targets.layer_profile.LayerTime`` as a dict, joined with its MACs, error and decision."""

    macs: int | None
    error_node: str | None
    snr_db: float | None
    cosine: float | None
    nonfinite: int
    decision: str | None
    qdq_nodes: list[str]
    compute_op: str | None
    float_reason: str | None


class ProfiledLayerRow(_ProfiledKeys, total=False):
    """One executed layer of a pair as the section holds it (``qdeploy.core.layer_rows.LayerRow`` reads it);
    the error it adds is set once every row is made (``qdeploy.pipeline.results.layers.added_error``)."""

    snr_drop_db: float | None
    nonfinite_born: bool


class LayerGraphFacts(TypedDict):
    """Per node of the artifact's graph (by name): op type, position, producers, and whether a DequantizeLinear
    feeds it or a QuantizeLinear follows it; ``order``: the node names in graph order."""

    op_types: dict[str, str]
    order: list[str]
    position: dict[str, int]
    dq_fed: dict[str, bool]
    q_after: dict[str, bool]
    producers: dict[str, list[str]]


class TimelineColumns(TypedDict):
    """Every layer in execution order, one list per column."""

    layer: list[str]
    time_ms: list[float]
    precision: list[str]
    snr_db: list[float | None]


class _ShareKeys(TypedDict):
    macs: int
    time_ms: float
    layers: int


class PrecisionShare(_ShareKeys, total=False):
    """What one precision ran of a pair: MACs, time, layers, and their shares of the pair's (None: no whole)."""

    macs_share: float | None
    time_share: float | None


class SlowInt8Diagnosis(TypedDict):
    """An int8 artifact slower than expected: its speedup, the expected one, the causes named, the line."""

    speedup: float
    expected: float
    causes: list[str]
    line: str


class PairSummaryDict(TypedDict):
    """A pair's summary: shares per precision, totals, the lines a deployer reads first, the slow-int8 diagnosis."""

    by_precision: dict[str, PrecisionShare]
    time_ms: float
    macs: int
    lines: list[str]
    slow: SlowInt8Diagnosis | None


def top_rows(rows: list[ProfiledLayerRow], key: str, count: int = TOP) -> list[ProfiledLayerRow]:
    """The ``count`` rows that cost most time (``time_ms``) or add most error (``snr_db``), as the section holds
    them (ranked as the readers rank them: ``qdeploy.pipeline.report.layers``)."""
    typed = [LayerRow.model_validate(row) for row in rows]
    place = {id(row): index for index, row in enumerate(typed)}
    ranked = by_time(typed) if key == "time_ms" else by_error(typed)
    return [rows[place[id(row)]] for row in ranked[:count]]


def timeline(rows: list[ProfiledLayerRow]) -> TimelineColumns:
    """Every layer in execution order, compactly (the chart's data, kept even when the rows are not)."""
    return {"layer": [r["layer"] for r in rows], "time_ms": [round(r.get("time_ms") or 0.0, 6) for r in rows],
            "precision": [r["precision"] for r in rows],
            "snr_db": [None if r.get("snr_db") is None else round(r["snr_db"], 2) for r in rows]}


def _share(part: float, whole: float) -> float | None:
    return part / whole if whole else None


def _pct(value: float | None) -> str:
    if value is None:
        return "n/a"
    return "<1%" if 0 < value < 0.005 else f"{value * 100:.0f}%"


def pair_summary(rows: list[ProfiledLayerRow], *, target: str, artifact_precision: str,
                 speedup: float | None) -> PairSummaryDict:
    """Shares per precision, the lines a deployer reads first, and the slow-int8 diagnosis."""
    total_time = sum(r.get("time_ms") or 0.0 for r in rows)
    total_macs = sum(r.get("macs") or 0 for r in rows)
    shares: dict[str, PrecisionShare] = {}
    for row in rows:
        entry = shares.setdefault(row["precision"], {"macs": 0, "time_ms": 0.0, "layers": 0})
        entry["macs"] += row.get("macs") or 0
        entry["time_ms"] += row.get("time_ms") or 0.0
        entry["layers"] += 1
    for entry in shares.values():
        entry["macs_share"] = _share(entry["macs"], total_macs)
        entry["time_share"] = _share(entry["time_ms"], total_time)
    lines = [f"{name} kernels: {_pct(entry['macs_share'])} of MACs, {_pct(entry['time_share'])} of time on {target}"
             for name, entry in sorted(shares.items(), key=lambda item: -(item[1]["time_ms"]))]
    lines += _float_compute_lines(rows, artifact_precision)
    slow = _slow_int8(rows, total_time, total_macs, speedup) if artifact_precision == "int8" else None
    if slow:
        lines.append(slow["line"])
    return {"by_precision": shares, "time_ms": total_time, "macs": total_macs, "lines": lines, "slow": slow}


def _float_compute_lines(rows: list[ProfiledLayerRow], artifact_precision: str) -> list[str]:
    """'3 Convs ran in float: ...' for compute layers of a reduced artifact that ran in float, grouped by reason."""
    if artifact_precision not in ("int8", "fp16", "int4"):
        return []
    wanted = ("int8",) if artifact_precision in ("int8", "int4") else ("f16", "bf16", "int8")
    grouped: dict[str, Counter[str]] = {}
    for row in rows:
        if row.get("macs") and row["precision"] not in wanted and row.get("float_reason"):
            grouped.setdefault(row["float_reason"], Counter())[row.get("compute_op") or row["op"]] += 1
    lines = []
    for reason, ops in grouped.items():
        what = ", ".join(f"{count} {op}{'s' if count > 1 else ''}" for op, count in ops.items())
        lines.append(f"{what} ran in float: {reason}")
    return lines


def float_reason(nodes: list[str], decisions: dict[str, str], graph: LayerGraphFacts, target: str) -> str:
    """Why a compute node of a reduced artifact ran in float on ``target``: a recorded decision, or the graph."""
    for node in nodes:
        if node in decisions:
            return decisions[node]
    compute = next((n for n in nodes if graph["op_types"].get(n) in ("Conv", "MatMul", "Gemm", "ConvTranspose")),
                   None)
    if compute is None:
        return "not fused into an int8 kernel"
    if not graph["dq_fed"].get(compute):
        return "not quantized: no DequantizeLinear feeds it (the quantizer left it float)"
    if not graph["q_after"].get(compute):
        return (f"unfused Q/DQ: its inputs are dequantized but its output is not quantized (no QuantizeLinear "
                f"after it), so {target} runs DequantizeLinear -> float kernel instead of an int8 one")
    return (f"unfused Q/DQ: {target} did not fuse the DequantizeLinear -> op -> QuantizeLinear pattern into an "
            "int8 kernel")


def _slow_int8(rows: list[ProfiledLayerRow], total_time: float, total_macs: int,
               speedup: float | None) -> SlowInt8Diagnosis | None:
    if speedup is None or speedup >= EXPECTED_INT8_SPEEDUP:
        return None
    qdq = sum(r.get("time_ms") or 0.0 for r in rows
              if r["precision"] == "q/dq" or (r["nodes"] and all(n in r.get("qdq_nodes", ()) for n in r["nodes"])))
    layout = sum(r.get("time_ms") or 0.0 for r in rows if r["op"] in LAYOUT_OPS and not r["nodes"])
    float_macs = sum(r.get("macs") or 0 for r in rows if r["precision"] in FLOAT)
    float_time = sum(r.get("time_ms") or 0.0 for r in rows if r["precision"] in FLOAT and r.get("macs"))
    causes = {
        "unfused Q/DQ": (_share(qdq, total_time), f"{_pct(_share(qdq, total_time))} of time in QuantizeLinear/"
                                                  "DequantizeLinear layers"),
        "a layout change": (_share(layout, total_time), f"{_pct(_share(layout, total_time))} of time in "
                                                        "Reorder/Transpose layers the runtime added"),
        "a float fallback": (max(_share(float_macs, total_macs) or 0.0, _share(float_time, total_time) or 0.0),
                             f"{_pct(_share(float_macs, total_macs))} of MACs ran in float"),
    }
    named = [(name, why) for name, (share, why) in sorted(causes.items(), key=lambda c: -(c[1][0] or 0))
             if share is not None and share >= _NAMING_SHARE]
    words = "; ".join(f"{name} ({why})" for name, why in named) or \
        "no single cause: the int8 kernels themselves take the time (" + \
        ", ".join(why for _, why in causes.values()) + ")"
    return {"speedup": speedup, "expected": EXPECTED_INT8_SPEEDUP, "causes": [name for name, _ in named],
            "line": f"int8 is slower than expected ({fmt_number(speedup, 3)}x the reference, expected at least "
                    f"{EXPECTED_INT8_SPEEDUP}x): {words}"}
