"""`qdeploy package --target T` on a run with nothing to package for T refuses (exit 2) naming each row's status
and reason there, as docs/packages.md promises, not only "no artifact passed validation"."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from qdeploy.cli import app
from qdeploy.pipeline.report.verdict import verdict_section
from tests.helpers.reports import check_row, synthetic_report

UNAVAILABLE = "target ort:cuda is not available here; this machine's onnxruntime has CPUExecutionProvider"


def _run_folder(tmp_path: Path, with_verdict: bool) -> Path:
    report = synthetic_report()
    report["validation"] = [row for row in report["validation"] if row["target"] != "ort:cuda"]
    report["validation"] += [{"variant": name, "target": "ort:cuda", "status": "unavailable", "reason": UNAVAILABLE,
                              "metrics": {}} for name in ("fp32", "fp16", "int8")]
    report["validation"].append(check_row("fp16", "openvino:cpu", 0.9, 10.0, status="failed"))
    if with_verdict:
        report["verdict"] = verdict_section(report)
    report["artifacts"] = []  # nothing published: the run's files verify (an empty SHA256SUMS), the refusal speaks
    run = tmp_path / "run"
    (run / "artifacts").mkdir(parents=True)
    (run / "artifacts" / "SHA256SUMS").write_text("")
    (run / "report.json").write_text(json.dumps(report))
    return run


def _package(run: Path, target: str, tmp_path: Path) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["package", str(run), "--target", target, "--out", str(tmp_path / "dist")])
    return result.exit_code, result.output


def test_an_unavailable_target_names_its_rows_status_and_reason(tmp_path: Path) -> None:
    code, output = _package(_run_folder(tmp_path, with_verdict=True), "ort:cuda", tmp_path)
    assert code == 2, output
    assert f"fp32, fp16, int8 unavailable ({UNAVAILABLE})" in output, output


def test_a_target_where_nothing_passed_names_each_failure(tmp_path: Path) -> None:
    code, output = _package(_run_folder(tmp_path, with_verdict=False), "openvino:cpu", tmp_path)
    assert code == 2, output
    assert "nothing to package for openvino:cpu" in output and "fp16 failed (bad)" in output, output
