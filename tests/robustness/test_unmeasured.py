"""A run whose requested measurements errored is not "passed": the report says what the recipe asked that
could not be measured, and the run exits 1 unless the recipe allows it (report.allow_unmeasured).  A target
this machine lacks is reported unavailable and never fails the run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from qdeploy.core.rows import BenchmarkRow, ValidationRow
from qdeploy.pipeline.results.gates import run_passes, unmeasured
from tests.robustness.helpers import assert_clean_input_error, recipe_with_model, run_cli

BODY = """
name: r
model: {onnx: MODEL}
variants:
  fp32: [simplify]
  fp16: [simplify, fp16]
targets: [ort:cpu, ort:cuda]
validate: {reference: fp32, samples: 2}
benchmark: {batch_sizes: [1, 2], warmup: 0, iterations: 2, rounds: 1}
"""

BENCHMARKS_ERROR = """
import qdeploy.stages.benchmark
def _broken(*args, **kwargs):
    raise RuntimeError("zip() argument 2 is shorter than argument 1")
qdeploy.stages.benchmark._prepare = _broken
"""
"""Run prelude: every benchmark row errors, as the issue's model with a doubled output did."""


def _report(out: Path) -> dict:
    return json.loads((out / "report.json").read_text())


@pytest.mark.slow
def test_benchmarks_that_all_errored_fail_the_run_and_say_what(tmp_path: Path) -> None:
    recipe = recipe_with_model(tmp_path, body=BODY)
    result = run_cli("run", str(recipe), "-q", "--out", str(tmp_path / "out"), code=BENCHMARKS_ERROR)
    assert result.returncode == 1, result.stderr[-2000:]
    report = _report(tmp_path / "out")
    assert report["passed"] is False
    assert {(row["variant"], row["target"], row["batch_size"]) for row in report["unmeasured"]} == {
        (variant, "ort:cpu", batch) for variant in ("fp32", "fp16") for batch in (1, 2)}  # ort:cuda: unavailable
    assert all(row["kind"] == "benchmark" and "zip() argument 2" in row["reason"] and not row["allowed"]
               for row in report["unmeasured"])
    assert all(row["status"] == "passed" for row in report["validation"] if row["target"] == "ort:cpu")
    markdown = (tmp_path / "out" / "report.md").read_text()
    assert "**FAILED**" in markdown and "## Asked for but not measured" in markdown
    assert "benchmark of fp16 on ort:cpu, batch 2: RuntimeError: zip() argument 2" in markdown
    assert "Asked for but not measured" in (tmp_path / "out" / "report.html").read_text()


@pytest.mark.slow
def test_the_recipe_may_allow_unmeasured_rows(tmp_path: Path) -> None:
    recipe = recipe_with_model(tmp_path, body=BODY + "report: {allow_unmeasured: [benchmark]}\n")
    result = run_cli("run", str(recipe), "-q", "--out", str(tmp_path / "out"), code=BENCHMARKS_ERROR)
    assert result.returncode == 0, result.stderr[-2000:]
    report = _report(tmp_path / "out")
    assert report["passed"] is True and len(report["unmeasured"]) == 4  # ort:cuda is unavailable, not unmeasured
    assert {row["status"] for row in report["benchmarks"] if row["target"] == "ort:cuda"} == {"unavailable"}
    assert all(row["allowed"] for row in report["unmeasured"])
    assert "(allowed by report.allow_unmeasured)" in (tmp_path / "out" / "report.md").read_text()


def test_allow_unmeasured_is_validated(tmp_path: Path) -> None:
    recipe = recipe_with_model(tmp_path, body=BODY + "report: {allow_unmeasured: [latency]}\n")
    assert_clean_input_error(run_cli("check", str(recipe)), "allow_unmeasured")


def _bench(variant: str, target: str, batch: int, status: str, p50: float | None = 1.0) -> BenchmarkRow:
    stats = {key: p50 for key in ("p50", "p90", "p99", "mean", "min", "max")}
    return BenchmarkRow(variant=variant, target=target, batch_size=batch, status=status, reason=status,
                        latency_ms=stats if p50 is not None else None)


def test_unmeasured_rows_errors_nan_and_missing() -> None:
    validation = [ValidationRow(variant="a", target="ort:cpu", status="passed"),
                  ValidationRow(variant="b", target="ort:cpu", status="error", reason="MemoryError"),
                  ValidationRow(variant="a", target="ort:cuda", status="unavailable", reason="no GPU")]
    benchmarks = [_bench("a", "ort:cpu", 1, "ok"), _bench("b", "ort:cpu", 1, "ok", float("nan")),
                  _bench("a", "ort:cuda", 1, "unavailable", None), _bench("b", "ort:cuda", 1, "unavailable", None)]
    found = unmeasured(validation, benchmarks, (["a", "b"], ["ort:cpu", "ort:cuda"], [1]), allowed=["validate"])
    assert [(row.kind, row.variant, row.target, row.reason, row.allowed) for row in found] == [
        ("validate", "b", "ort:cpu", "MemoryError", True),
        ("benchmark", "b", "ort:cpu", "median latency is not a number", False),
        ("validate", "b", "ort:cuda", "no validation result", True),
    ]
    assert not run_passes([], validation, [], found)
    assert run_passes([], validation, [], [row for row in found if row.allowed])
