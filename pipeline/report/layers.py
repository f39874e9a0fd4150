"""The ``layers`` section of report.json for people: report.md's summary lines and `qdeploy explain`'s text.

Each profiled (variant, target) reads first as its summary (the share of MACs and of time per precision that
ran, why compute layers ran in float, why int8 is slower than expected), then the layers that cost most time and
those that add most error.  report.html's part is in ``_html_layers``.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from qdeploy.core.layer_rows import LayerPair, LayerRow, LayersSection
from qdeploy.core.report import Report, as_report
from qdeploy.core.runtimes import variants_named
from qdeploy.pipeline.report.format import fmt_number

__all__ = ["by_error", "by_time", "explain_text", "layer_markdown", "overhead_line", "select_pairs"]

_NODES_SHOWN = 3


def by_time(rows: list[LayerRow]) -> list[LayerRow]:
    """Rows that took time, most first."""
    return sorted((r for r in rows if r.time_ms), key=lambda r: -(r.time_ms or 0.0))


def by_error(rows: list[LayerRow]) -> list[LayerRow]:
    """Rows with a measured error, the ones that add most first: where NaN/Inf is born (an fp16 overflow), then by
    the SNR the layer loses (its inputs' minus its own), then by the lowest SNR."""
    hurt = [r for r in rows if r.snr_db is not None or r.nonfinite]
    return sorted(hurt, key=lambda r: (not r.nonfinite_born, -(r.snr_drop_db or 0.0),
                                       r.snr_db if r.snr_db is not None else float("-inf")))


def select_pairs(section: LayersSection | None, variants: Collection[str] | None = None,
                 target: str | None = None) -> list[LayerPair]:
    """The profiled pairs, filtered by variants and target."""
    return [pair for pair in (section.pairs if section else [])
            if (variants is None or pair.variant in variants) and (target is None or pair.target == target)]


def overhead_line(section: LayersSection, run_seconds: float | None = None) -> str:
    """What the profiling pass cost: its wall time, and the run's it is part of."""
    total = f" of the run's {run_seconds:.1f} s" if run_seconds else ""
    return (f"profiling pass ({section.mode}): {section.seconds:.2f} s{total}, after the timed "
            "benchmark and apart from it (no latency number comes from a profiled session)")


def _pair_header(pair: LayerPair) -> str:
    why = {"shipped": "what the verdict ships", "failed validation": "validation failed", "full": "report.layers: full"}
    return f"{pair.variant} on {pair.target} ({why.get(pair.why, pair.why)})"


def _profile_line(pair: LayerPair) -> str:
    profile = pair.profile
    bench = profile.benchmark_p50_ms if profile else None
    versus = f" against the benchmark's {fmt_number(bench)} ms p50" if bench else ""
    layers = pair.summary.time_ms if pair.summary else None
    return (f"profiled inference: {fmt_number(profile.profiled_ms if profile else None)} ms median of "
            f"{profile.runs if profile else None} runs{versus} (the profiler's own cost included); its layers' "
            f"medians add up to {fmt_number(layers)} ms; pair took {pair.seconds:.2f} s")


def layer_markdown(report: Report | Mapping[str, Any]) -> list[str]:
    """report.md's section: per profiled pair, its summary lines and the top 3 layers by time and by error."""
    report = as_report(report)
    section = report.layers
    if section is None:
        return []
    lines = [f"- {overhead_line(section, report.seconds)}"]
    if section.reason:
        lines.append(f"- {section.reason}")
    for pair in section.pairs:
        lines.append(f"- **{_pair_header(pair)}**")
        if pair.status != "ok" or pair.summary is None:
            lines.append(f"  - not profiled: {pair.reason}")
            continue
        lines += [f"  - {line}" for line in pair.summary.lines]
        lines.append("  - most time: " + "; ".join(_short(row, "time") for row in (pair.top_time or [])[:3]))
        if pair.top_error:
            lines.append("  - most error: " + "; ".join(_short(row, "error") for row in pair.top_error[:3]))
        if pair.exposure is not None and pair.exposure.changed:
            lines.append(f"  - {pair.exposure.note}")
    return ["", "## Layers: where the time and the error come from", "",
            "`qdeploy explain OUT` prints the tables; report.html sorts them.", "", *lines]


def _short(row: LayerRow, kind: str) -> str:
    what = f"`{row.layer}` ({row.op}, {row.precision})"
    if kind == "time":
        return f"{what} {fmt_number(row.time_ms)} ms"
    return f"{what} SNR {fmt_number(row.snr_db)} dB"


def _nodes(row: LayerRow) -> str:
    if not row.nodes:
        return "(gap: added by the runtime)"
    more = f" +{len(row.nodes) - _NODES_SHOWN}" if len(row.nodes) > _NODES_SHOWN else ""
    return ",".join(row.nodes[:_NODES_SHOWN]) + more


def _table(rows: list[LayerRow], total_ms: float, *, error: bool = False) -> list[str]:
    last = "drop dB" if error else "MACs"
    head = f"  {'#':>3} {'layer':32} {'op':22} {'ran':5} {'ms':>9} {'time':>5} {last:>9} {'SNR dB':>7}  onnx nodes"
    lines = [head]
    for rank, row in enumerate(rows, 1):
        share = f"{row.time_ms / total_ms * 100:.0f}%" if total_ms and row.time_ms else "–"
        decision = f"  [{row.decision}]" if row.decision else ""
        snr = "NaN/Inf" if row.nonfinite_born else fmt_number(row.snr_db)
        extra = fmt_number(row.snr_drop_db) if error else fmt_number(row.macs)
        lines.append(f"  {rank:>3} {row.layer[:32]:32} {row.op[:22]:22} {row.precision[:5]:5} "
                     f"{fmt_number(row.time_ms):>9} {share:>5} {extra:>9} {snr:>7}  {_nodes(row)}{decision}")
    return lines


_MODE_WORDS = {"auto": "auto profiles what the verdict ships on each target and every pair whose validation failed",
               "full": "full profiles every pair validation could run"}


def _not_profiled(section: LayersSection, variant: str | None, builds: list[str] | None, target: str | None) -> str:
    """What explain says of a pair the run did not profile: what it did profile, and how to profile this one."""
    what = f"variant {variant}" if variant is not None else "any variant"
    if builds is not None and builds != [variant]:
        what += f" (built per runtime as {', '.join(builds)})"
    what += f" on {target}" if target is not None else ""
    known = ", ".join(f"{p.variant} on {p.target}" for p in section.pairs) or "none"
    mode = section.mode
    how = ("set `report: {layers: full}` in the recipe and run it again to profile every pair" if mode != "full"
           else "validation could not run it there (its row in the report says why)")
    return (f"no profiled pair matches {what}: report.layers {_MODE_WORDS.get(str(mode), mode)}; profiled: "
            f"{known}. {how[0].upper()}{how[1:]}")


def explain_text(report: Report | Mapping[str, Any], variant: str | None = None, target: str | None = None,
                 top: int = 10) -> str:
    """`qdeploy explain`'s text: per profiled pair, the summary and the top layers by time and by error."""
    report = as_report(report)
    section = report.layers
    if section is None:
        return ("this run has no layers section: it was made with report.layers: off, or by a qdeploy without "
                "the per-layer pass; run it again with report.layers: auto or full")
    names = [artifact.name for artifact in report.artifacts]
    builds = (variants_named(variant, names) or [variant]) if variant is not None else None
    pairs = select_pairs(section, builds, target)
    if not pairs:
        return _not_profiled(section, variant, builds, target)
    out = [overhead_line(section, report.seconds)]
    for pair in pairs:
        out += ["", _pair_header(pair)]
        if pair.status != "ok" or pair.summary is None or pair.exposure is None:
            out.append(f"  not profiled: {pair.reason}")
            continue
        out += [f"  {line}" for line in pair.summary.lines]
        out += [f"  {_profile_line(pair)}", f"  {pair.exposure.note}"]
        rows = pair.rows
        timed = by_time(rows) if rows else (pair.top_time or [])
        hurt = by_error(rows) if rows else (pair.top_error or [])
        total = pair.summary.time_ms
        out += ["", f"  most time (top {min(top, len(timed))} of {pair.rows_total} layers):",
                *_table(timed[:top], total)]
        out += ["", f"  most error added, against the float32 reference (top {min(top, len(hurt))}; drop: the SNR "
                "the layer loses):", *_table(hurt[:top], total, error=True)]
        if pair.unclaimed_nodes:
            unclaimed = pair.unclaimed_nodes
            out.append(f"  {len(unclaimed)} ONNX nodes have no layer of their own (fused or folded, not named by the "
                       f"runtime): {', '.join(unclaimed[:8])}{' ...' if len(unclaimed) > 8 else ''}")
    return "\n".join(out)
