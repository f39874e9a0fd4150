"""What `qdeploy compare` says is true: the thresholds it judged by (or that it judged nothing), the rows that
regressed even with -q, no regression within the noise of either run, each warning once, and recipes compared by
what their paths point at (issue 29)."""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path
from typing import Any

from typer.testing import CliRunner

from qdeploy.cli import app
from qdeploy.pipeline.recipe.loader import load_recipe_file
from qdeploy.pipeline.results.compare_runs import Thresholds, compare_reports, format_comparison
from qdeploy.pipeline.results.summary import build_report
from tests.helpers.reports import synthetic_report

REPO = Path(__file__).resolve().parents[3]
NOTHING_JUDGED = "no thresholds set: differences shown, nothing judged"


def _row(report: dict[str, Any], variant: str) -> dict[str, Any]:
    return next(row for row in report["benchmarks"] if row["variant"] == variant and row["target"] == "ort:cpu")


def _scaled(row: dict[str, Any], factor: float, ci95: list[float] | None = None) -> None:
    """Every latency figure of a benchmark row times `factor` (its 95% interval `ci95` when given)."""
    stats = row["latency_ms"]
    for key in ("p50", "p90", "p99", "mean", "min", "max"):
        stats[key] *= factor
    stats["ci95_p50"] = ci95 or [bound * factor for bound in stats["ci95_p50"]]
    row["round_p50_ms"] = [value * factor for value in row["round_p50_ms"]]


def _slow_pair() -> tuple[dict[str, Any], dict[str, Any]]:
    """Run B's `slow` row at 24.6 ms where run A measured 9.0 ms, far beyond either run's noise."""
    before = synthetic_report()
    after = copy.deepcopy(before)
    _scaled(_row(after, "slow"), 24.6 / 9.0)
    return before, after


def _folders(tmp_path: Path, before: dict[str, Any], after: dict[str, Any]) -> tuple[str, str]:
    for name, report in (("a", before), ("b", after)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "report.json").write_text(json.dumps(report))
    return str(tmp_path / "a"), str(tmp_path / "b")


def test_without_thresholds_compare_says_it_judged_nothing(tmp_path: Path) -> None:
    run_a, run_b = _folders(tmp_path, *_slow_pair())
    result = CliRunner().invoke(app, ["compare", run_a, run_b])
    assert result.exit_code == 0
    assert "slow on ort:cpu, batch 1: 9 -> 24.6" in result.stdout
    assert NOTHING_JUDGED in result.stdout
    assert "no regression beyond the thresholds" not in result.stdout  # there were none to be beyond


def test_compare_names_the_thresholds_it_judged_by(tmp_path: Path) -> None:
    run_a, run_b = _folders(tmp_path, *_slow_pair())
    result = CliRunner().invoke(app, ["compare", run_a, run_b, "--max-latency-regression", "0.1",
                                      "--max-metric-drop", "cosine=0.001"])
    assert result.exit_code == 1
    assert "thresholds: median latency of B at most 1.1x A's; cosine worse by at most 0.001" in result.stdout
    assert NOTHING_JUDGED not in result.stdout
    only_latency = format_comparison(compare_reports(*_slow_pair(), Thresholds(0.1)), "a", "b")
    assert "(fidelity metrics: no threshold, not judged)" in only_latency


def test_quiet_compare_still_prints_the_rows_that_regressed(tmp_path: Path) -> None:
    run_a, run_b = _folders(tmp_path, *_slow_pair())
    result = CliRunner().invoke(app, ["compare", run_a, run_b, "--max-latency-regression", "0.1", "-q"])
    assert result.exit_code == 1
    assert "REGRESSION median latency (ms) of slow on ort:cpu, batch 1: 9 -> 24.6" in result.stdout
    assert "1 regression(s)" in result.stdout
    assert "int8 on ort:cpu" not in result.stdout  # only what regressed
    quiet_ok = CliRunner().invoke(app, ["compare", run_a, run_a, "--max-latency-regression", "0.1", "-q"])
    assert quiet_ok.exit_code == 0 and quiet_ok.stdout == ""


def test_a_change_within_either_runs_noise_is_never_a_regression() -> None:
    before = synthetic_report()  # int8: 1.0 ms, 95% interval [0.95, 1.05], rounds 0.9 to 1.1
    overlapping, in_rounds, beyond = (copy.deepcopy(before) for _ in range(3))
    _scaled(_row(overlapping, "int8"), 1.3, ci95=[1.0, 1.6])  # B's own interval is wide and reaches A's
    _scaled(_row(in_rounds, "int8"), 1.15)  # intervals apart, but 0.15 ms is within A's 0.2 ms of round spread
    _scaled(_row(beyond, "int8"), 1.5)  # beyond both
    limits = Thresholds(max_latency_regression=0.1)
    for after, why in ((overlapping, "95% intervals of the medians overlap"), (in_rounds, "per-round medians")):
        comparison = compare_reports(before, after, limits)
        change = next(c for c in comparison.changes if c.subject == "int8 on ort:cpu, batch 1")
        assert not change.regression and change.within_noise and comparison.regressions == []
        assert "within noise" in change.detail and why in change.detail and "not a regression" in change.detail
        text = format_comparison(comparison, "a", "b")
        assert "REGRESSION" not in text
        assert "1 latency change(s) beyond the threshold are within noise, not regressions" in text
    flagged = compare_reports(before, beyond, limits).regressions
    assert [c.subject for c in flagged] == ["int8 on ort:cpu, batch 1"]
    assert "within noise" not in flagged[0].detail and "beyond the noise either run measured" in flagged[0].detail


def test_each_warning_is_printed_once(tmp_path: Path) -> None:
    before, after = _slow_pair()
    after["environment"]["versions"]["onnx"] = "1.99"
    run_a, run_b = _folders(tmp_path, before, after)
    result = CliRunner().invoke(app, ["compare", run_a, run_b])
    assert result.exit_code == 0
    assert result.output.count("environment differs: onnx 1.23 vs 1.99") == 1  # stdout and stderr together


def _project(folder: Path) -> Path:
    """The demo's model and data copied into a new `folder`; the folder."""
    folder.mkdir()
    shutil.copy(REPO / "recipes/models/demo_cnn.onnx", folder / "model.onnx")
    shutil.copytree(REPO / "recipes/data/calib", folder / "calib")
    return folder


def _recipe(path: Path, model: str, data: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"name: moved\nmodel: {{onnx: {model}}}\ndata: {{calib: {{reader: npy, path: {data}}}}}\n"
                    "variants: {fp32: []}\n")
    return path


def _report_of(recipe: Path) -> dict[str, Any]:
    report = synthetic_report()
    report["recipe"] = build_report(load_recipe_file(recipe), [], [], [], [], [], seconds=0.0).recipe.to_json()
    return report


def test_a_moved_recipe_that_reads_the_same_files_is_the_same_recipe(tmp_path: Path) -> None:
    shared = _project(tmp_path / "shared")
    here = _report_of(_recipe(tmp_path / "one" / "recipe.yaml", "../shared/model.onnx", "../shared/calib"))
    moved = _report_of(_recipe(tmp_path / "two" / "deeper" / "recipe.yaml", "../../shared/model.onnx",
                               str(shared / "calib")))
    assert here["recipe"]["sections"]["model"] != moved["recipe"]["sections"]["model"]  # the path text differs
    assert not [w for w in compare_reports(here, moved).warnings if "recipe differs" in w]
    sample = next((shared / "calib").iterdir())
    sample.write_bytes(sample.read_bytes()[:-4] + b"\x00\x00\x80\x3f")  # same name, same path text, other values
    changed = _report_of(_recipe(tmp_path / "one" / "recipe.yaml", "../shared/model.onnx", "../shared/calib"))
    assert "recipe differs in: data" in compare_reports(here, changed).warnings


def test_an_older_report_is_compared_by_path_text_and_the_output_says_so(tmp_path: Path) -> None:
    shared = _project(tmp_path / "shared")
    old = _report_of(_recipe(tmp_path / "one" / "recipe.yaml", "../shared/model.onnx", "../shared/calib"))
    new = _report_of(_recipe(tmp_path / "two" / "recipe.yaml", str(shared / "model.onnx"), "../shared/calib"))
    del old["recipe"]["content"]  # written before reports recorded what their recipe's paths point at
    comparison = compare_reports(old, new)
    assert "recipe differs in: model" in comparison.warnings  # the text fallback: the paths are written otherwise
    assert comparison.notes and comparison.notes[0].startswith("report A does not record what its recipe's paths")
    assert f"note: {comparison.notes[0]}" in format_comparison(comparison, "a", "b")
    assert compare_reports(new, copy.deepcopy(new)).notes == []
