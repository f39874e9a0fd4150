"""Each row of the reports says the precision that really ran, from its own record: rows of one target that ran at
different precisions (f32 pinned, bf16 default, f32 pinned where the bf16 default missed) are told apart in
report.md, report.html and the terminal, the speedups name the precision of both sides, and the verdict says
which pinned setting it ships."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from qdeploy.pipeline.report import render_markdown
from qdeploy.pipeline.report.html import render_html
from qdeploy.pipeline.report.verdict import verdict_section
from tests.helpers.reports import bench_row, check_row, synthetic_report

TARGET = "openvino:cpu"


def _execution(ran: str) -> dict[str, Any]:
    return {"target": TARGET, "runtime": "openvino", "device": "CPU", "providers": ["CPU"], "precision": ran,
            "precisions": {ran.upper(): 3}}


def mixed_precision_report() -> dict[str, Any]:
    report = synthetic_report()
    attempts = [{"setting": "default", "ran": "bf16", "status": "failed", "passed": False,
                 "metrics": {"cosine": 0.988}, "reason": "cosine 0.988 < 0.995", "tolerance": {"cosine_min": 0.995}},
                {"setting": "f32", "ran": "f32", "status": "passed", "passed": True, "metrics": {"cosine": 0.99995},
                 "reason": "", "tolerance": {"cosine_min": 0.999}}]
    report["validation"] += [
        check_row("fp32", TARGET, 1.0, 200.0, precision="fp32", precision_hint="f32", execution=_execution("f32")),
        check_row("fp16", TARGET, 0.99995, 45.0, precision="fp16", precision_hint="f32", deploy_precision="f32",
                  precision_attempts=attempts, execution=_execution("f32")),
        check_row("int8", TARGET, 0.99, 25.0, precision="int8", precision_hint=None, execution=_execution("bf16")),
    ]
    settings = {"PERFORMANCE_HINT": "LATENCY", "NUM_STREAMS": 1}
    report["benchmarks"] += [
        bench_row("fp32", TARGET, 4.0, [4.0, 4.1, 3.9], speedup=1.0, speedup_range=[1.0, 1.0], precision_hint="f32",
                  execution=_execution("f32"), settings={**settings, "INFERENCE_PRECISION_HINT": "f32"}),
        bench_row("fp16", TARGET, 1.5, [1.5, 1.6, 1.4], speedup=2.7, speedup_range=[2.6, 2.8], precision_hint="f32",
                  execution=_execution("f32"), settings={**settings, "INFERENCE_PRECISION_HINT": "f32"}),
        bench_row("int8", TARGET, 2.0, [2.0, 2.1, 1.9], speedup=2.0, speedup_range=[1.9, 2.1], precision_hint=None,
                  execution=_execution("bf16"), settings={**settings, "INFERENCE_PRECISION_HINT": "bf16"}),
    ]
    report["verdict"] = verdict_section(report)
    return report


LABELS = {"fp32": "f32 (pinned)", "fp16": "f32 (pinned; default bf16 missed)", "int8": "bf16 (device default)"}


def test_markdown_says_per_row_what_ran_and_never_copies_a_targets_first_row() -> None:
    text = render_markdown(mixed_precision_report())
    for variant, label in LABELS.items():
        assert f"| {variant} | {TARGET} | {label} |" in text
    measured = text.split("## How latency was measured", 1)[1]
    target_line = next(line for line in measured.splitlines() if line.startswith(f"- {TARGET}: sync"))
    assert "INFERENCE_PRECISION_HINT" not in target_line  # not the first row's f32, said of every row
    assert "INFERENCE_PRECISION_HINT per row: fp32 f32, fp16 f32, int8 bf16" in measured
    assert "int8 (bf16 float parts) vs fp32 (f32)" in text and "fp16 (f32) vs fp32 (f32)" in text
    assert "precision attempts: default (bf16) failed, cosine 0.988; f32 (f32) passed" in text
    assert "with INFERENCE_PRECISION_HINT f32 pinned (the device default missed" in text  # the verdict ships fp16


def test_html_says_per_row_what_ran() -> None:
    page = render_html(mixed_precision_report())
    for label in LABELS.values():
        assert f"<td>{label}</td>" in page
    assert "int8 (bf16 float parts) vs fp32 (f32)" in page
    assert "INFERENCE_PRECISION_HINT per row: fp32 f32, fp16 f32, int8 bf16" in page


def test_terminal_says_per_row_what_ran(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    from qdeploy.cli import _print_summary

    monkeypatch.setenv("COLUMNS", "400")
    _print_summary(mixed_precision_report(), Path("out"))
    printed = capsys.readouterr().out
    rows = {line.split()[0]: line for line in printed.splitlines() if TARGET in line and line.split()}
    for variant, label in LABELS.items():
        assert label in rows[variant], rows
    assert "int8 (bf16 float parts) vs fp32 (f32)" in printed


def test_terminal_rows_stay_on_one_line_in_a_ci_log(capsys: pytest.CaptureFixture[str],
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Without a terminal (CI logs) Rich would fold the table at 80 columns, splitting labels and numbers."""
    from qdeploy.cli import _print_summary

    monkeypatch.delenv("COLUMNS", raising=False)
    _print_summary(mixed_precision_report(), Path("out"))
    printed = capsys.readouterr().out
    rows = {line.split()[0]: line for line in printed.splitlines() if TARGET in line and line.split()}
    for variant, label in LABELS.items():
        assert label in rows[variant], printed
    assert any("int8 (bf16 float parts) vs fp32 (f32)" in line for line in rows.values()), printed


def test_a_weight_only_rows_pinned_setting_reads_as_pinned_not_as_a_missed_default() -> None:
    """'int4@f32' is pinned to f32 by design (its package pins it if shipped): it read 'f32 (pinned; default
    default missed)'."""
    from qdeploy.core.rows import ValidationRow
    from qdeploy.pipeline.report.precision import ran_label

    row = ValidationRow.from_json(check_row("int4@f32", TARGET, 0.999, 40.0, precision="int4", precision_hint="f32",
                                            deploy_precision="f32", execution=_execution("f32")))
    assert ran_label(row) == "f32 (pinned)"
    missed = ValidationRow.from_json(check_row("fp16", TARGET, 0.9999, 45.0, precision="fp16", precision_hint="f32",
                                               deploy_precision="f32", execution=_execution("f32")))
    assert ran_label(missed) == "f32 (pinned; the default missed)"  # no attempts recorded: no made-up name
