"""Charts of report.html as inline SVG (matplotlib, no pyplot and no global state): latency bars and the
accuracy-versus-latency scatter with its Pareto front.

The SVG is cut down to what an HTML page needs inline: no XML prolog, DOCTYPE, metadata or namespace
declarations (an HTML parser puts <svg> in the SVG namespace by itself), so the page references nothing outside.
"""

from __future__ import annotations

import io
import re
from typing import Any

from qdeploy.pipeline.report.view import MatrixRow, TradeoffPoint

__all__ = ["MARKERS", "PALETTE", "colors_for", "inline_svg", "latency_bars_svg", "tradeoff_svg"]

PALETTE = ("#3b6ea8", "#e07b39", "#4c9a5b", "#b5485d", "#7a5ea8", "#8c6d46", "#d46fb1", "#6f7f8c")
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")


def colors_for(names: list[str]) -> dict[str, str]:
    """A stable colour per variant, the same in every chart and in the table's swatches."""
    return {name: PALETTE[index % len(PALETTE)] for index, name in enumerate(dict.fromkeys(names))}


def latency_bars_svg(rows: list[MatrixRow], colors: dict[str, str]) -> str:
    """Grouped bars of median latency per target and batch, one bar per variant, 95% CI as error bars."""
    measured = [row for row in rows if row.benchmark_status == "ok" and row.p50 is not None]
    if not measured:
        return ""
    groups = list(dict.fromkeys((row.target, row.batch) for row in measured))
    variants = list(dict.fromkeys(row.variant for row in measured))
    figure = _figure(max(6.0, 1.2 + 0.55 * len(groups) * len(variants)), 3.6)
    axes = figure.add_subplot()
    width = 0.8 / len(variants)
    for index, variant in enumerate(variants):
        xs, heights, errors, hatches = [], [], [[], []], []
        for position, (target, batch) in enumerate(groups):
            row = next((r for r in measured if (r.target, r.batch, r.variant) == (target, batch, variant)), None)
            if row is None:
                continue
            p50 = float(row.p50 or 0.0)
            low, high = (row.latency.ci95_p50 if row.latency else None) or [p50, p50]
            xs.append(position + (index - (len(variants) - 1) / 2) * width)
            heights.append(p50)
            errors[0].append(max(0.0, p50 - low))
            errors[1].append(max(0.0, high - p50))
            hatches.append("///" if row.bench is not None and row.bench.noisy else "")
        bars = axes.bar(xs, heights, width * 0.92, yerr=errors, capsize=3,
                        color=colors.get(variant, PALETTE[0]), edgecolor="white", error_kw={"elinewidth": 1})
        for bar, hatch, height, above in zip(bars, hatches, heights, errors[1], strict=True):
            bar.set_hatch(hatch)
            axes.annotate(f"{height:.3g}", (bar.get_x() + bar.get_width() / 2, height + above), xytext=(0, 2),
                          textcoords="offset points", ha="center", va="bottom", fontsize=7)
    axes.set_xticks(range(len(groups)))
    axes.set_xticklabels([f"{target}\nbatch {batch}" for target, batch in groups], fontsize=8)
    axes.set_ylabel("median latency (ms)")
    axes.set_title("Median latency, 95% CI of the median (hatched: noisy)", fontsize=10)
    _variant_legend(axes, variants, colors)
    _tidy(axes)
    return _svg(figure, "latency")


def tradeoff_svg(points: list[TradeoffPoint], label: str, colors: dict[str, str]) -> str:
    """Fidelity against median latency; Pareto-front points ringed and joined by a step line."""
    if not points:
        return ""
    targets = list(dict.fromkeys(point.target for point in points))
    figure = _figure(6.0, 3.9)
    axes = figure.add_subplot()
    for point in points:
        marker = MARKERS[targets.index(point.target) % len(MARKERS)]
        axes.scatter([point.latency_ms], [point.fidelity], s=70 if point.on_front else 45, marker=marker,
                     color=colors.get(point.variant, PALETTE[0]), edgecolors="black" if point.on_front else "none",
                     linewidths=1.4, zorder=3)
    _label_points(axes, points)
    for target in targets:  # one front per target: a model ships to one target, not to the best of all
        front = sorted((p for p in points if p.on_front and p.target == target), key=lambda p: p.latency_ms)
        if len(front) > 1:
            axes.step([p.latency_ms for p in front], [p.fidelity for p in front], where="post", color="#444444",
                      linestyle="--", linewidth=1, zorder=2)
    latencies = [p.latency_ms for p in points]
    if min(latencies) > 0 and max(latencies) / min(latencies) > 8:
        from matplotlib.ticker import FuncFormatter

        axes.set_xscale("log")
        plain = FuncFormatter(lambda value, _: f"{value:g}")
        axes.xaxis.set_major_formatter(plain)
        axes.xaxis.set_minor_formatter(plain)
    for index, target in enumerate(targets):  # a legend of marker shapes = targets
        axes.scatter([], [], marker=MARKERS[index % len(MARKERS)], color="#777777", label=target)
    axes.legend(fontsize=8, frameon=False, loc="best")
    axes.set_xlabel("median latency (ms), lower is better")
    axes.set_ylabel(f"{label}, higher is better")
    axes.set_title("Accuracy vs latency (ringed and dashed: Pareto front per target)", fontsize=10)
    _pad_limits(axes, points)
    _tidy(axes)
    return _svg(figure, "tradeoff")


def _variant_legend(axes: Any, variants: list[str], colors: dict[str, str]) -> None:
    """A legend of plain swatches (a hatched first bar must not make every variant look noisy)."""
    from matplotlib.patches import Patch

    handles = [Patch(facecolor=colors.get(name, PALETTE[0]), label=name) for name in variants]
    axes.legend(handles=handles, fontsize=8, frameon=False, ncols=min(len(variants), 6), loc="upper center",
                bbox_to_anchor=(0.5, -0.18))


def _label_points(axes: Any, points: list[TradeoffPoint]) -> None:
    """Name each point; a label that would land on an earlier one near it moves down a line."""
    xs = [p.latency_ms for p in points]
    ys = [p.fidelity for p in points]
    x_span = (max(xs) - min(xs)) or 1.0
    y_span = (max(ys) - min(ys)) or 1.0
    placed: list[tuple[float, float, int]] = []
    for point in sorted(points, key=lambda p: (p.latency_ms, -p.fidelity)):
        near = [shift for x, y, shift in placed
                if abs(x - point.latency_ms) / x_span < 0.25 and abs(y - point.fidelity) / y_span < 0.08]
        shift = max(near) + 1 if near else 0
        placed.append((point.latency_ms, point.fidelity, shift))
        axes.annotate(f"{'≥ ' if point.capped else ''}{point.variant} · {point.target}",
                      (point.latency_ms, point.fidelity),
                      xytext=(6, 4 - 10 * shift), textcoords="offset points", fontsize=7, color="#333333")


def _pad_limits(axes: Any, points: list[TradeoffPoint]) -> None:
    low = min(p.fidelity for p in points)
    high = max(p.fidelity for p in points)
    pad = (high - low) * 0.12 or (abs(high) * 0.01 or 1.0)
    axes.set_ylim(low - pad, high + pad)


def _figure(width: float, height: float) -> Any:
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), dpi=96, layout="constrained")


def _tidy(axes: Any) -> None:
    axes.spines[["top", "right"]].set_visible(False)
    axes.grid(axis="y", color="#e5e5e5", linewidth=0.6)
    axes.set_axisbelow(True)


def _svg(figure: Any, salt: str) -> str:
    """The figure as inline SVG: text kept as text, ids salted per chart so two charts never share an id."""
    import matplotlib

    buffer = io.StringIO()
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": salt, "font.family": "DejaVu Sans"}):
        figure.savefig(buffer, format="svg", metadata={"Date": None})
    return inline_svg(buffer.getvalue())


def inline_svg(svg: str) -> str:
    """Strip what an inline SVG must not carry into a self-contained page."""
    svg = re.sub(r"<\?xml[^>]*\?>", "", svg)
    svg = re.sub(r"<!DOCTYPE[^>]*>", "", svg)
    svg = re.sub(r"<metadata>.*?</metadata>", "", svg, flags=re.S)
    svg = re.sub(r'\s+xmlns(:\w+)?="[^"]*"', "", svg)
    svg = re.sub(r'(<svg\b[^>]*?)\s+width="[^"]*"\s+height="[^"]*"', r'\1 role="img"', svg, count=1)
    return svg.strip()
