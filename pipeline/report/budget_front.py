"""report.html's accuracy-budget section: the front a latency-aware budget recorded (``budget.weigh_latency``,
docs/quantize-budget.md), one chart per variant and target.

Each point of ``findings.budget.front.points`` is a model the budget measured: the fully quantized one, the set
ranked by harm and the set ranked by harm per second.  The chart puts its task metric (or, for an output
tolerance, its error over the allowed error, lower is better) against the seconds its float nodes add per
inference on that target; the point the budget wrote is ringed and named, points that miss the tolerance are
hollow.  The chart is a hand-written SVG (no script, nothing fetched); every point names itself on hover.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from qdeploy.core.report import Report, as_report
from qdeploy.pipeline.report.format import escape_html, fmt_number

__all__ = ["Front", "FrontPoint", "budget_front_html", "budget_fronts", "front_points", "front_svg"]


class _Read(BaseModel):
    """What the chart reads of the budget's front, typed; its other keys are the budget's own."""

    model_config = ConfigDict(extra="ignore")


class _Measured(_Read):
    metric: float | None = None
    error_ratio: float | None = None


class _Comparison(_Read):
    held_back: _Measured | None = None
    search: _Measured | None = None


class _Point(_Read):
    found_by: str = "?"
    kept_float: list[Any] = Field(default_factory=list)
    holds: bool = False
    task_or_error: _Comparison | None = None
    added_seconds_per_inference: dict[str, float | None] = Field(default_factory=dict)


class Front(_Read):
    """``findings.budget.front`` of a quantize step, as the chart reads it (``qdeploy.stages.accuracy_budget``)."""

    points: list[_Point] = Field(default_factory=list)
    chosen: int | None = None
    chosen_by: str | None = None


class _Budget(_Read):
    front: Front | None = None


class _StepFindings(_Read):
    budget: _Budget | None = None

_W, _H, _LEFT, _RIGHT, _TOP, _BOTTOM = 440.0, 230.0, 58.0, 16.0, 14.0, 40.0
_HOLDS, _MISSES, _CHOSEN = "#1a7f37", "#cf222e", "#1f2328"


@dataclass
class FrontPoint:
    """One model of a budget's front on one target."""

    found_by: str
    added_ms: float
    value: float | None
    holds: bool
    chosen: bool
    kept: int


def budget_fronts(report: Report | Mapping[str, Any]) -> list[tuple[str, Front]]:
    """(variant, front) for every artifact whose lineage holds a budget front with points."""
    found = []
    for artifact in as_report(report).artifacts:
        for step in artifact.lineage:
            try:
                budget = _StepFindings.model_validate(step.findings or {}).budget
            except ValidationError:  # a front another qdeploy wrote: no chart rather than no report
                continue
            if budget is not None and budget.front is not None and budget.front.points:
                found.append((artifact.name, budget.front))
    return found


def _value(point: _Point) -> tuple[float | None, bool]:
    """The point's task metric (higher is better), else its error ratio (lower is better): (value, is_metric);
    the held-back samples' when measured there."""
    measured = point.task_or_error
    part = (measured.held_back if measured and measured.held_back and measured.held_back.model_fields_set
            else measured.search if measured else None) or _Measured()
    if part.metric is not None:
        return float(part.metric), True
    return (float(part.error_ratio), False) if part.error_ratio is not None else (None, False)


def front_points(front: Front | Mapping[str, Any], target: str) -> tuple[list[FrontPoint], bool]:
    """The front's points on ``target`` and whether their values are a task metric."""
    front = front if isinstance(front, Front) else Front.model_validate(dict(front))
    points, metric = [], False
    for index, point in enumerate(front.points):
        seconds = point.added_seconds_per_inference.get(target)
        if seconds is None:
            continue
        value, is_metric = _value(point)
        metric = metric or is_metric
        points.append(FrontPoint(point.found_by, float(seconds) * 1e3, value, point.holds, index == front.chosen,
                                 len(point.kept_float)))
    return points, metric


def _scale(low: float, high: float, size: float, flip: bool) -> Any:
    span = (high - low) or max(abs(high), 1.0) * 0.1
    low, high = low - span * 0.08, high + span * 0.08
    return lambda value: ((high - value) if flip else (value - low)) / (high - low) * size


def front_svg(points: list[FrontPoint], metric: bool, target: str) -> str:
    """Value against added milliseconds on ``target``; the chosen point ringed, misses hollow."""
    drawn = [point for point in points if point.value is not None]
    if not drawn:
        return ""
    width, height = _W - _LEFT - _RIGHT, _H - _TOP - _BOTTOM
    xs, ys = [point.added_ms for point in drawn], [float(point.value or 0.0) for point in drawn]
    x_of, y_of = _scale(min(xs), max(xs), width, False), _scale(min(ys), max(ys), height, True)
    label = "task metric (higher is better)" if metric else "error / allowed error (lower is better)"
    parts = [f'<svg viewBox="0 0 {_W:.0f} {_H:.0f}" width="{_W:.0f}" role="img" '
             f'aria-label="budget front on {escape_html(target)}: {label} against added latency">',
             f'<rect x="{_LEFT}" y="{_TOP}" width="{width}" height="{height}" fill="#f6f8fa" stroke="#d0d7de"/>']
    for value in sorted({min(ys), max(ys)}):
        y = _TOP + y_of(value)
        parts.append(f'<text x="{_LEFT - 4}" y="{y + 4:.1f}" font-size="10" text-anchor="end">'
                     f'{escape_html(fmt_number(value))}</text>')
    for value in sorted({min(xs), max(xs)}):
        x = _LEFT + x_of(value)
        parts.append(f'<text x="{x:.1f}" y="{_TOP + height + 13}" font-size="10" text-anchor="middle">'
                     f'{escape_html(fmt_number(value))}</text>')
    for point in sorted(drawn, key=lambda point: point.chosen):  # the chosen one drawn last, on top
        x, y = _LEFT + x_of(point.added_ms), _TOP + y_of(float(point.value or 0.0))
        color = _HOLDS if point.holds else _MISSES
        fill = color if point.holds else "none"
        tip = escape_html(f"{point.found_by}: {point.kept} kept float, +{fmt_number(point.added_ms)} ms, "
                          f"{fmt_number(point.value)}, {'holds' if point.holds else 'misses'}"
                          f"{' (chosen)' if point.chosen else ''}")
        parts.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="5" fill="{fill}" stroke="{color}" stroke-width="2">'
                     f'<title>{tip}</title></circle>')
        if point.chosen:
            parts.append(f'<circle class="chosen" cx="{x:.1f}" cy="{y:.1f}" r="9" fill="none" stroke="{_CHOSEN}" '
                         f'stroke-width="1.5"/><text x="{x + 11:.1f}" y="{y - 8:.1f}" font-size="10">chosen</text>')
    parts.append(f'<text x="{_LEFT + width / 2:.0f}" y="{_H - 8:.0f}" font-size="11" text-anchor="middle">'
                 f'ms added per inference on {escape_html(target)} by the nodes kept float</text>'
                 f'<text x="12" y="{_TOP + height / 2:.0f}" font-size="11" text-anchor="middle" '
                 f'transform="rotate(-90 12 {_TOP + height / 2:.0f})">{label}</text></svg>')
    return "".join(parts)


def budget_front_html(report: Report | Mapping[str, Any]) -> str:
    """The section: per variant with a front, one chart per target it was timed on; '' when none."""
    charts = []
    for variant, front in budget_fronts(report):
        targets = dict.fromkeys(target for point in front.points for target in point.added_seconds_per_inference)
        for target in targets:
            points, metric = front_points(front, target)
            svg = front_svg(points, metric, target)
            if svg:
                charts.append(f'<figure class="chart"><figcaption>{escape_html(variant)} on '
                              f'{escape_html(target)} (the budget chose by the time on '
                              f'{escape_html(front.chosen_by)})</figcaption>{svg}</figure>')
    if not charts:
        return ""
    return ("<h2>Accuracy budget: metric against added latency</h2><p class=\"note\">Each point is a set of "
            "nodes the budget measured kept float: filled where it holds the tolerance, hollow where it misses; "
            "the ringed point is the artifact written (docs/quantize-budget.md).</p>" + "".join(charts))
