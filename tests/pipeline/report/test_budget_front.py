"""report.html draws a latency-aware budget's front per target: metric against added latency, the chosen point
ringed."""

from __future__ import annotations

import copy
import re
from typing import Any

from qdeploy.pipeline.report.budget_front import budget_front_html, front_points
from qdeploy.pipeline.report.html import render_html
from tests.helpers.reports import synthetic_report


def _point(found_by: str, kept: list[str], holds: bool, metric: float, seconds: dict[str, float]) -> dict[str, Any]:
    part = {"passed": holds, "metric": metric, "reference_metric": 0.95, "drop": 0.95 - metric}
    return {"found_by": found_by, "kept_float": kept, "holds": holds,
            "task_or_error": {"search": part, "held_back": part},
            "added_seconds_per_inference": seconds, "recipe": {"exclude_nodes": kept}}


FRONT = {"timing": {"ort:cpu": "given", "openvino:cpu": "given"}, "chosen_by": "ort:cpu", "chosen": 2, "points": [
    _point("fully quantized", [], False, 0.71, {"ort:cpu": 0.0, "openvino:cpu": 0.0}),
    _point("ranked by harm", ["fc0"], True, 0.94, {"ort:cpu": 0.004, "openvino:cpu": 0.003}),
    _point("ranked by harm per second on ort:cpu", ["fc2"], True, 0.935, {"ort:cpu": 0.001, "openvino:cpu": 0.002}),
]}


def report_with_front() -> dict[str, Any]:
    report = copy.deepcopy(synthetic_report())
    report["artifacts"].append({"name": "int8-task", "path": "int8-task.onnx", "sha256": "0" * 64, "size_bytes": 1,
                                "lineage": [{"stage": "quantize", "cached": False, "seconds": 1.0,
                                             "findings": {"budget": {"met": True, "front": FRONT}}}]})
    return report


def test_one_chart_per_target_with_the_chosen_point_ringed() -> None:
    section = budget_front_html(report_with_front())
    charts = re.findall(r"<svg.*?</svg>", section, flags=re.S)
    assert len(charts) == 2 and "int8-task on ort:cpu" in section and "int8-task on openvino:cpu" in section
    for chart in charts:
        assert chart.count('class="chosen"') == 1 and chart.count("<circle") == 4  # 3 points + the ring
        assert "task metric (higher is better)" in chart and "fill=\"none\" stroke=\"#cf222e\"" in chart  # a miss
    assert "ranked by harm per second on ort:cpu: 1 kept float, +1.00 ms, 0.935, holds (chosen)" in charts[0]
    points, metric = front_points(FRONT, "openvino:cpu")
    assert metric and [p.added_ms for p in points] == [0.0, 3.0, 2.0] and [p.chosen for p in points][2]


def test_the_page_shows_the_section_only_with_a_front() -> None:
    assert "Accuracy budget: metric against added latency" in render_html(report_with_front())
    assert "Accuracy budget: metric against added latency" not in render_html(synthetic_report())
    no_points = report_with_front()
    no_points["artifacts"][-1]["lineage"][0]["findings"]["budget"]["front"] = {"points": [], "chosen": None}
    assert budget_front_html(no_points) == ""


def test_an_output_tolerance_front_plots_its_error_ratio() -> None:
    front = copy.deepcopy(FRONT)
    for point in front["points"]:
        point["task_or_error"] = {"search": {"passed": point["holds"], "error_ratio": 0.5 if point["holds"] else 3.0}}
    points, metric = front_points(front, "ort:cpu")
    assert not metric and [p.value for p in points] == [3.0, 0.5, 0.5]
