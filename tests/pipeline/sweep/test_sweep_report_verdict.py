"""The sweep report says what to ship per recipe and target, and the targets this machine lacks once (issue 29)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

from qdeploy.pipeline.sweep.report import build_sweep_report, render_sweep_html, render_sweep_markdown
from tests.helpers.demo_report import demo_report, mixed_rows_report


def _job(name: str, report: dict[str, Any], folder: Path) -> Any:
    targets = list(dict.fromkeys(row["target"] for row in report["validation"]))
    return SimpleNamespace(entry=SimpleNamespace(name=name, origin=f"{name}.yaml"), folder=folder / name,
                           status="passed", reason=None, plan=SimpleNamespace(targets=targets),
                           result=SimpleNamespace(report=report, exit_code=0))


def _sweep(tmp_path: Path) -> dict[str, Any]:
    jobs = [_job("demo", demo_report(), tmp_path), _job("mixed", mixed_rows_report(), tmp_path)]
    return build_sweep_report("two", jobs, [], {"kind": "local"}, tmp_path, started=0.0, seconds=1.0).to_json()


def test_a_verdict_per_recipe_and_target(tmp_path: Path) -> None:
    report = _sweep(tmp_path)
    picks = {(entry["recipe"], entry["target"]): entry for entry in report["verdicts"]}
    assert list(picks) == [("demo", "ort:cpu"), ("demo", "openvino:cpu"), ("mixed", "ort:cpu"),
                           ("mixed", "openvino:cpu"), ("mixed", "ort:cuda")]
    assert picks["demo", "ort:cpu"]["variant"] == "int8" and picks["mixed", "ort:cpu"]["variant"] == "fp16"
    assert "ran all 13 of its kernels in float32" in picks["mixed", "ort:cpu"]["ran"]
    text = render_sweep_markdown(report)
    shipped = text.split("## What to ship", 1)[1].split("\n## ", 1)[0]
    assert ("- demo on openvino:cpu: ship int8 (int8 artifact with float parts at bf16 (device default) on OpenVINO "
            "CPU): 0.682 ms") in shipped
    assert "- mixed on ort:cpu: ship fp16 (fp16 artifact, but onnxruntime ran all 13" in shipped
    assert shipped.count("package packages/") == 5
    assert "<h2>What to ship</h2>" in render_sweep_html(report)


def test_unavailable_targets_are_one_line_not_a_row_per_variant(tmp_path: Path) -> None:
    report = _sweep(tmp_path)
    assert not any(row["target"] in ("openvino:gpu", "ort:cuda") and row["recipe"] == "demo"
                   for row in report["rows"])
    assert [row["target"] for row in report["rows"] if row["status"] == "unavailable"] == []
    text = render_sweep_markdown(report)
    [line] = [line for line in text.splitlines() if "openvino:gpu" in line]
    assert line == ("Not available on this machine: openvino:gpu (this machine's OpenVINO has devices CPU; asked for "
                    "by demo, mixed); ort:cuda (this machine's onnxruntime has CPUExecutionProvider; asked for by "
                    "demo).")  # mixed_rows_report measured ort:cuda: not said to lack it
    assert "| demo | fp32 | ort:cuda |" not in text
