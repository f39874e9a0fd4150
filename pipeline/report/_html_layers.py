"""report.html's layers section: per profiled pair, its summary, one chart (time per layer in execution order,
coloured by the precision that ran, the error as a heat strip under it) and a table sorted three ways.

The page runs no script, so "sortable" is three pre-sorted copies of the table (execution order, time, error)
switched by radio buttons and CSS.  The chart is a hand-written SVG: one bar per layer, readable at 300 layers
(each bar carries a <title> that names the layer on hover).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from qdeploy.core.layer_rows import LayerPair, LayerRow
from qdeploy.core.report import Report, as_report
from qdeploy.pipeline.report.format import escape_html, fmt_number
from qdeploy.pipeline.report.layers import by_error, by_time, overhead_line

__all__ = ["LAYERS_CSS", "PRECISION_COLORS", "layers_html", "layers_svg"]

PRECISION_COLORS = {"int8": "#4c9a5b", "f16": "#3b6ea8", "bf16": "#7a5ea8", "f32": "#e07b39", "q/dq": "#b5485d",
                    "f64": "#8c6d46"}
_OTHER = "#9aa3ab"
LAYERS_CSS = """
.layers .tabs input { display: none; }
.layers .tabs label { display: inline-block; padding: 3px 10px; border: 1px solid #ccd; border-radius: 4px;
  margin-right: 4px; cursor: pointer; font-size: 0.9em; }
.layers .tabs input:checked + label { background: #3b6ea8; color: #fff; }
.layers .sorted { display: none; }
.layers .tabs input.by-order:checked ~ .sorted.by-order, .layers .tabs input.by-time:checked ~ .sorted.by-time,
.layers .tabs input.by-error:checked ~ .sorted.by-error { display: table; }
.layers .legend span { display: inline-block; margin-right: 12px; font-size: 0.85em; }
.layers .legend i { display: inline-block; width: 10px; height: 10px; margin-right: 4px; }
"""
_W, _BARS_H, _STRIP_H = 1000.0, 160.0, 14.0


def _snr_color(snr: float | None) -> str:
    """Red at 10 dB or less, yellow at 30, green at 60 or more; grey where the error is unknown."""
    if snr is None:
        return "#dde1e5"
    x = max(0.0, min(1.0, (snr - 10.0) / 50.0))
    red, green = (220, int(60 + 340 * x)) if x < 0.5 else (int(220 - 300 * (x - 0.5)), 200)
    return f"#{max(0, min(255, red)):02x}{max(0, min(255, green)):02x}50"


def layers_svg(timeline: dict[str, list[Any]]) -> str:
    """Bars of time per layer (execution order), coloured by precision; an SNR heat strip below."""
    times = timeline.get("time_ms") or []
    if not times:
        return ""
    width = _W / len(times)
    top = max(times) or 1.0
    parts = [f'<svg viewBox="0 0 {_W:.0f} {_BARS_H + _STRIP_H + 22:.0f}" role="img" '
             'aria-label="time per layer, coloured by precision; error heat strip">']
    for index, (name, ms, precision, snr) in enumerate(zip(timeline["layer"], times, timeline["precision"],
                                                           timeline["snr_db"], strict=False)):
        x = index * width
        height = max(0.5, ms / top * _BARS_H) if ms else 0.0
        tip = escape_html(f"{name}: {fmt_number(ms)} ms, {precision}, SNR {fmt_number(snr)} dB")
        parts.append(f'<rect x="{x:.2f}" y="{_BARS_H - height:.2f}" width="{max(width * 0.9, 0.4):.2f}" '
                     f'height="{height:.2f}" fill="{PRECISION_COLORS.get(precision, _OTHER)}"><title>{tip}</title>'
                     f'</rect><rect x="{x:.2f}" y="{_BARS_H + 4:.2f}" width="{max(width, 0.4):.2f}" '
                     f'height="{_STRIP_H:.0f}" fill="{_snr_color(snr)}"><title>{tip}</title></rect>')
    parts.append(f'<text x="0" y="{_BARS_H + _STRIP_H + 18:.0f}" font-size="11">layers in execution order '
                 f'({len(times)}); bar: time (tallest {fmt_number(top)} ms); strip: SNR against the float32 '
                 'reference (red low, green high, grey unknown)</text></svg>')
    return "".join(parts)


def _legend(timeline: dict[str, list[Any]]) -> str:
    seen = dict.fromkeys(timeline.get("precision") or [])
    return '<div class="legend">' + "".join(
        f'<span><i style="background:{PRECISION_COLORS.get(p, _OTHER)}"></i>{escape_html(p)}</span>'
        for p in seen) + "</div>"


def _rows_table(rows: list[LayerRow], css: str) -> str:
    head = "".join(f"<th>{name}</th>" for name in ("layer", "op", "ran", "exec", "ms", "MACs", "SNR dB", "SNR drop",
                                                     "cosine", "ONNX nodes", "decision"))
    body = []
    for row in rows:
        nodes = ", ".join(row.nodes) or "(gap: added by the runtime)"
        cells = (row.layer, row.op, row.precision, row.exec, fmt_number(row.time_ms),
                 fmt_number(row.macs), "NaN/Inf" if row.nonfinite_born else fmt_number(row.snr_db),
                 fmt_number(row.snr_drop_db), fmt_number(row.cosine, 6),
                 nodes, row.decision or row.float_reason or "")
        body.append("<tr>" + "".join(f"<td>{escape_html(str(cell))}</td>" for cell in cells) + "</tr>")
    return f'<table class="sorted {css}"><tr>{head}</tr>{"".join(body)}</table>'


def _pair_html(pair: LayerPair, index: int) -> str:
    title = escape_html(f"{pair.variant} on {pair.target} ({pair.why})")
    if pair.status != "ok" or pair.summary is None or pair.timeline is None or pair.exposure is None:
        return f"<h3>{title}</h3><p>not profiled: {escape_html(str(pair.reason))}</p>"
    lines = "".join(f"<li>{escape_html(line)}</li>" for line in pair.summary.lines)
    rows = pair.rows or list({r.layer: r for r in (pair.top_time or []) + (pair.top_error or [])}.values())
    timeline = pair.timeline.model_dump()
    order = {name: i for i, name in enumerate(pair.timeline.layer)}
    by_order = sorted(rows, key=lambda r: order.get(r.layer, 0))
    timed, hurt = by_time(rows), by_error(rows)
    timed += [r for r in rows if r not in timed]
    hurt += [r for r in rows if r not in hurt]
    shown = "every layer" if pair.rows else "the top layers by time and by error"
    name = f"layers-sort-{index}"
    tabs = "".join(f'<input type="radio" name="{name}" id="{name}-{key}" class="by-{key}"{checked}>'
                   f'<label for="{name}-{key}">{label}</label>'
                   for key, label, checked in (("order", "execution order", ""), ("time", "most time", " checked"),
                                               ("error", "most error", "")))
    return (f"<h3>{title}</h3><ul>{lines}</ul>{_legend(timeline)}"
            f'<div class="chart">{layers_svg(timeline)}</div>'
            f"<p>{escape_html(pair.exposure.note)}. Table: {shown}.</p>"
            f'<div class="tabs">{tabs}{_rows_table(by_order, "by-order")}{_rows_table(timed, "by-time")}'
            f'{_rows_table(hurt, "by-error")}</div>')


def layers_html(report: Report | Mapping[str, Any]) -> str:
    """The section, or '' when the run has none."""
    report = as_report(report)
    section = report.layers
    if section is None or not section.pairs:
        return ""
    pairs = "".join(_pair_html(pair, index) for index, pair in enumerate(section.pairs))
    return (f'<section class="layers"><h2>Layers: where the time and the error come from</h2>'
            f"<p>{escape_html(overhead_line(section, report.seconds))}</p>{pairs}</section>")
