"""`qdeploy compare`: latency ratios, metric changes, flipped gates, exit codes, on synthetic reports."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from qdeploy.cli import app
from qdeploy.core.errors import QdeployInputError
from qdeploy.pipeline.results.compare_runs import (
    NotComparableError,
    Thresholds,
    compare_reports,
    format_comparison,
    load_report,
    parse_metric_drops,
)
from tests.helpers.reports import synthetic_report


def _later(edit: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    before = synthetic_report()
    after = copy.deepcopy(before)
    edit(after)
    return before, after


def _row(report: dict[str, Any], section: str, variant: str, target: str = "ort:cpu") -> dict[str, Any]:
    return next(row for row in report[section] if row["variant"] == variant and row["target"] == target)


def _slow_down(row: dict[str, Any], factor: float) -> None:
    """Every latency figure of a benchmark row times `factor`, as a run that measured it so would record them."""
    stats = row["latency_ms"]
    for key in ("p50", "p90", "p99", "mean", "min", "max"):
        stats[key] *= factor
    stats["ci95_p50"] = [bound * factor for bound in stats["ci95_p50"]]
    row["round_p50_ms"] = [value * factor for value in row["round_p50_ms"]]


def test_identical_runs_have_no_regression_and_ratios_of_one() -> None:
    report = synthetic_report()
    comparison = compare_reports(report, copy.deepcopy(report), Thresholds(0.0, {"cosine": 0.0}))
    assert comparison.regressions == []
    latency = [change for change in comparison.changes if change.kind == "latency"]
    assert len(latency) == 4 and all(change.before == change.after for change in latency)
    assert "no regression" in format_comparison(comparison, "a", "b")


def test_latency_regression_beyond_the_threshold_only() -> None:
    def slower(report: dict[str, Any]) -> None:
        _slow_down(_row(report, "benchmarks", "int8"), 1.5)  # beyond its rounds' spread (20%): not noise
        _slow_down(_row(report, "benchmarks", "fp16"), 1.05)

    before, after = _later(slower)
    flagged = compare_reports(before, after, Thresholds(max_latency_regression=0.1)).regressions
    assert [change.subject for change in flagged] == ["int8 on ort:cpu, batch 1"]
    assert "ratio 1.500" in flagged[0].detail
    assert compare_reports(before, after, Thresholds(max_latency_regression=0.6)).regressions == []
    assert compare_reports(before, after).regressions == []  # no threshold, nothing fails on latency


def test_metric_drops_respect_each_metric_direction() -> None:
    def worse(report: dict[str, Any]) -> None:
        metrics = _row(report, "validation", "fp16")["metrics"]
        metrics["cosine"] -= 0.002  # higher is better: a drop
        metrics["max_abs_err"] += 0.5  # lower is better: a rise is the drop
        _row(report, "validation", "slow")["metrics"]["snr_db"] += 10  # better

    before, after = _later(worse)
    comparison = compare_reports(before, after, Thresholds(max_metric_drop={"cosine": 0.001, "max_abs_err": 0.1,
                                                                            "snr_db": 0.0}))
    assert sorted(change.subject for change in comparison.regressions) == [
        "cosine of fp16 on ort:cpu", "max_abs_err of fp16 on ort:cpu"]
    better = next(change for change in comparison.changes if change.subject == "snr_db of slow on ort:cpu")
    assert not better.regression and better.detail.startswith("better")
    assert compare_reports(before, after, Thresholds(max_metric_drop={"cosine": 0.01})).regressions == []


def test_gates_that_flip_and_builds_that_break_are_regressions() -> None:
    def flip(report: dict[str, Any]) -> None:
        report["gates"][0]["passed"] = False  # pass -> fail
        report["gates"][1]["passed"] = True  # fail -> pass
        report["failures"].append({"variant": "fp16", "stage": "fp16", "reason": "overflow", "kind": "stage"})
        _row(report, "validation", "slow")["status"] = "failed"

    before, after = _later(flip)
    comparison = compare_reports(before, after)
    regressions = {(change.kind, change.subject) for change in comparison.regressions}
    assert regressions == {("gate", "int8 on ort:cpu: speedup >= 1.2"), ("status", "build of variant fp16"),
                           ("status", "validation slow on ort:cpu")}
    fixed = next(change for change in comparison.changes if change.subject.endswith("cosine >= 0.9999"))
    assert (fixed.before, fixed.after, fixed.regression) == ("fail", "pass", False)
    text = format_comparison(comparison, "A", "B")
    assert "Gates that flipped" in text and "REGRESSION int8 on ort:cpu: speedup" in text


def test_rows_in_one_run_only_are_listed() -> None:
    def drop(report: dict[str, Any]) -> None:
        report["benchmarks"] = [row for row in report["benchmarks"] if row["variant"] != "slow"]
        _row(report, "benchmarks", "int8")["status"] = "error"
        _row(report, "benchmarks", "int8")["reason"] = "crashed"

    before, after = _later(drop)
    comparison = compare_reports(before, after)
    missing = {change.subject: change for change in comparison.changes if change.kind == "missing"}
    assert missing["benchmark slow on ort:cpu, batch 1"].after == "absent"
    assert missing["benchmark int8 on ort:cpu, batch 1"].after == "error"
    assert missing["benchmark int8 on ort:cpu, batch 1"].regression
    assert missing["benchmark slow on ort:cpu, batch 1"].regression  # A measured it, B did not
    gained = compare_reports(after, before)  # the other way round: B measures more than A
    new_rows = {change.subject: change for change in gained.changes if change.kind == "missing"}
    assert not new_rows["benchmark slow on ort:cpu, batch 1"].regression


def test_bad_input_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(QdeployInputError, match=r"no report\.json"):
        load_report(tmp_path)
    (tmp_path / "report.json").write_text("{not json")
    with pytest.raises(QdeployInputError, match=r"not a readable report\.json"):
        load_report(tmp_path)
    (tmp_path / "report.json").write_text(json.dumps({"benchmarks": []}))
    with pytest.raises(QdeployInputError, match="missing validation, gates"):
        load_report(tmp_path / "report.json")
    with pytest.raises(QdeployInputError, match="METRIC=VALUE"):
        parse_metric_drops(["cosine"])
    assert parse_metric_drops(["cosine=0.001", "snr_db = 3"]) == {"cosine": 0.001, "snr_db": 3.0}
    with pytest.raises(QdeployInputError, match="unknown metric"):
        compare_reports(synthetic_report(), synthetic_report(), Thresholds(max_metric_drop={"cosinus": 0.1}))


def test_cli_exit_codes(tmp_path: Path) -> None:
    before, after = _later(lambda report: _slow_down(_row(report, "benchmarks", "int8"), 2.0))
    run_a, run_b = tmp_path / "a", tmp_path / "b"
    for folder, report in ((run_a, before), (run_b, after)):
        folder.mkdir()
        (folder / "report.json").write_text(json.dumps(report))
    runner = CliRunner()
    ok = runner.invoke(app, ["compare", str(run_a), str(run_b)])
    assert ok.exit_code == 0 and "int8 on ort:cpu, batch 1: 1 -> 2" in ok.output
    failed = runner.invoke(app, ["compare", str(run_a), str(run_b / "report.json"), "--max-latency-regression", "0.5"])
    assert failed.exit_code == 1 and "REGRESSION" in failed.output
    missing = runner.invoke(app, ["compare", str(run_a), str(tmp_path / "nowhere")])
    assert missing.exit_code == 2 and "no report.json" in missing.output
    bad_option = runner.invoke(app, ["compare", str(run_a), str(run_b), "--max-metric-drop", "cosine"])
    assert bad_option.exit_code == 2


def _with_model(report: dict[str, Any], inputs: list[dict[str, Any]]) -> dict[str, Any]:
    report["model"] = {"exported_sha256": "ab" * 32, "inputs": inputs,
                       "outputs": [{"name": "logits", "type": "float", "shape": [1, 10]}]}
    report["recipe"]["sections"] = {"model": "m", "variants": "v", "benchmark": "b"}
    report["recipe"]["content"] = {"model": "m-content", "data": "d-content", "validate": "v-content"}
    return report


CNN_INPUT = [{"name": "input", "type": "float", "shape": [1, 3, 16, 16]}]


def test_nan_or_missing_values_in_b_are_regressions_whatever_the_thresholds() -> None:
    def broken(report: dict[str, Any]) -> None:
        _row(report, "benchmarks", "int8")["latency_ms"]["p50"] = float("nan")
        _row(report, "validation", "fp16")["metrics"]["cosine"] = float("nan")
        del _row(report, "validation", "slow")["metrics"]["snr_db"]

    before, after = _later(broken)
    comparison = compare_reports(before, after)  # no thresholds at all
    flagged = {change.subject for change in comparison.regressions}
    assert flagged == {"int8 on ort:cpu, batch 1", "cosine of fp16 on ort:cpu", "snr_db of slow on ort:cpu"}
    assert "no regression" not in format_comparison(comparison, "a", "b")
    fixed = compare_reports(after, before)  # NaN in A, a number in B: better, not worse
    assert fixed.regressions == []


def test_runs_of_different_models_are_refused_unless_allowed() -> None:
    before = _with_model(synthetic_report(), CNN_INPUT)
    after = _with_model(synthetic_report(), [{"name": "x", "type": "float", "shape": [4, 4]}])
    with pytest.raises(NotComparableError, match=r"model inputs differ: \[input float \[1, 3, 16, 16\]\] vs "
                                                 r"\[x float \[4, 4\]\].*--allow-mismatch"):
        compare_reports(before, after)
    allowed = compare_reports(before, after, allow_mismatch=True)
    assert allowed.warnings[0].startswith("model inputs differ")
    assert "WARNING: the runs differ" in format_comparison(allowed, "a", "b")


def test_runs_with_no_row_in_common_are_refused() -> None:
    before, after = synthetic_report(), synthetic_report()
    for row in after["benchmarks"] + after["validation"]:
        row["variant"] = "other-" + row["variant"]
    with pytest.raises(NotComparableError, match="share no variant and target"):
        compare_reports(before, after)


def test_recipe_and_environment_differences_are_named() -> None:
    before = _with_model(synthetic_report(), CNN_INPUT)
    after = _with_model(copy.deepcopy(before), CNN_INPUT)
    after["recipe"]["sections"]["benchmark"] = "other"
    after["environment"]["versions"]["onnx"] = "1.99"
    after["environment"]["cpu"]["model"] = "Other CPU"
    after["model"]["exported_sha256"] = "cd" * 32
    warnings = compare_reports(before, after).warnings
    assert "recipe differs in: benchmark" in warnings
    assert "environment differs: onnx 1.23 vs 1.99" in warnings
    assert "environment differs: cpu.model 'Test CPU' vs 'Other CPU'" in warnings
    assert any(warning.startswith("model differs: exported sha256 abababababab") for warning in warnings)
    assert compare_reports(before, copy.deepcopy(before)).warnings == []


def test_cli_refuses_different_models_with_exit_2(tmp_path: Path) -> None:
    before = _with_model(synthetic_report(), CNN_INPUT)
    after = _with_model(synthetic_report(), [{"name": "x", "type": "float", "shape": [4, 4]}])
    for folder, report in ((tmp_path / "a", before), (tmp_path / "b", after)):
        folder.mkdir()
        (folder / "report.json").write_text(json.dumps(report))
    runner = CliRunner()
    refused = runner.invoke(app, ["compare", str(tmp_path / "a"), str(tmp_path / "b")])
    assert refused.exit_code == 2 and "not comparable" in refused.output and "model inputs differ" in refused.output
    forced = runner.invoke(app, ["compare", str(tmp_path / "a"), str(tmp_path / "b"), "--allow-mismatch"])
    assert forced.exit_code == 0 and "WARNING" in forced.output


def test_a_row_qdeploy_cannot_read_is_an_input_error_naming_the_run_and_field(tmp_path: Path) -> None:
    before, after = _later(lambda report: _row(report, "validation", "int8").update(status="passd"))
    with pytest.raises(QdeployInputError,
                       match=r"run B: report.json has a row qdeploy cannot read \(validation\.\d+\.status"):
        compare_reports(before, after)
    before, after = _later(lambda report: _row(report, "benchmarks", "fp16")["latency_ms"].pop("p50"))
    with pytest.raises(QdeployInputError, match=r"run B: .*latency_ms\.p50"):
        compare_reports(before, after)
    run_a, run_b = tmp_path / "a", tmp_path / "b"
    for folder, report in ((run_a, before), (run_b, after)):
        folder.mkdir()
        (folder / "report.json").write_text(json.dumps(report))
    result = CliRunner().invoke(app, ["compare", str(run_a), str(run_b)])
    assert result.exit_code == 2 and "Traceback" not in result.output and f"{run_b}/report.json" in result.output


def test_a_validation_that_passed_and_is_now_unreadable_is_a_regression() -> None:
    """The target no longer reads the model (status ``unreadable``): what A measured, B did not."""
    def unreadable(report: dict[str, Any]) -> None:
        row = _row(report, "validation", "slow")
        row.update(status="unreadable", unreadable=True, metrics={}, reason="ort:cpu cannot read the original model")

    comparison = compare_reports(*_later(unreadable))
    assert [(change.subject, change.before, change.after) for change in comparison.regressions
            if change.kind == "status"] == [("validation slow on ort:cpu", "passed", "unreadable")]


def test_a_run_timed_on_a_busy_machine_says_so() -> None:
    def busy(report: dict[str, Any]) -> None:
        _row(report, "benchmarks", "int8")["machine_load"] = {"busy": True, "other_cores": 1.2, "cores": 2}

    before, after = _later(busy)
    [change] = [c for c in compare_reports(before, after).changes if c.subject == "int8 on ort:cpu, batch 1"]
    assert "run B timed on a busy machine (other processes used 1.20 of 2 cores)" in change.detail
    [quiet] = [c for c in compare_reports(before, before).changes if c.subject == "int8 on ort:cpu, batch 1"]
    assert "busy" not in quiet.detail
