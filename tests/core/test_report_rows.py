"""report.json's result rows and records: the same keys and value types as before they became typed models, and
every row and record parses into its model and serializes back to exactly the dict it came from."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import qdeploy
from qdeploy.core.rows import (
    BenchmarkRow,
    BuildFailure,
    GateResult,
    ResultRow,
    ThroughputRow,
    UnmeasuredEntry,
    ValidationRow,
)
from qdeploy.pipeline.recipe.loader import load_recipe_file
from qdeploy.pipeline.run.runner import RunOptions, run_recipe
from tests.helpers.models import write_recipe
from tests.helpers.report_keys import (
    RECORDS,
    ROWS_RECIPE,
    ROWS_TARGETS,
    UNMEASURED_RECIPE,
    fail_float16_sessions,
    key_schema,
)

SCHEMA = Path(__file__).with_name("report_rows_schema.json")
OTHER_RUNS = frozenset({"validation/unreadable"})
"""Row kinds of the schema that another run checks: a target that cannot read the original model
(tests/pipeline/run/test_frozen_inputs.py)."""
MODELS: dict[str, type[ResultRow]] = {"validation": ValidationRow, "benchmarks": BenchmarkRow,
                                      "throughput": ThroughputRow, "gates": GateResult, "failures": BuildFailure,
                                      "unmeasured": UnmeasuredEntry}


def _run(tmp_path: Path, body: str, targets: list[str] | None = None) -> tuple[int, dict]:
    recipe = load_recipe_file(write_recipe(tmp_path, body))
    result = run_recipe(recipe, RunOptions(out_dir=tmp_path / "out", show_progress=False, targets=targets))
    return result.exit_code, json.loads((tmp_path / "out" / "report.json").read_text())


def _assert_round_trips(report: dict, sections: tuple[str, ...]) -> None:
    for section in sections:
        assert report[section], section
        for row in report[section]:
            assert MODELS[section].from_json(row).to_json() == row, (section, row)


@pytest.mark.slow  # a whole run; tests/core/test_rows.py round-trips each row model on the fast loop
def test_rows_keep_the_keys_and_types_of_report_json_and_round_trip(tmp_path: Path) -> None:
    exit_code, report = _run(tmp_path, ROWS_RECIPE, ROWS_TARGETS)
    assert exit_code == 1  # int8 misses the strict cosine on purpose: a failed row with its divergence
    # written by qdeploy before the typed rows and records (tests/helpers/report_keys.py says how)
    schema = json.loads(SCHEMA.read_text())
    assert key_schema(report) == {name: keys for name, keys in schema.items()
                                  if not name.startswith("unmeasured/") and name not in OTHER_RUNS}
    _assert_round_trips(report, ("validation", "benchmarks", "throughput", "gates", "failures"))
    failed = next(row for row in report["validation"] if row["status"] == "failed")
    assert failed["variant"] == "int8" and failed["divergence"]["node"]
    assert [failure["variant"] for failure in report["failures"]] == ["broken"]
    opened = qdeploy.open_run(tmp_path / "out")
    assert [row.to_json() for row in opened.validation] == report["validation"]
    assert {row.status for row in opened.benchmarks} == {"ok", "unavailable"}
    assert all(row.mode == "throughput" for row in opened.throughput)
    assert [gate.to_json() for gate in opened.gates] == report["gates"]
    assert [(gate.variant, gate.passed, gate.skipped) for gate in opened.gates if not gate.passed] == [
        ("int8", False, False), ("int8", False, False), ("broken", False, False), ("fp32", None, True)]
    assert opened.failures[0].stage == "quantize" and opened.failures[0].kind == "stage"


def test_unmeasured_entries_keep_their_keys_and_round_trip(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fail_float16_sessions(monkeypatch)
    exit_code, report = _run(tmp_path, UNMEASURED_RECIPE)
    assert exit_code == 1  # the benchmarks are not allowed to go unmeasured
    schema = json.loads(SCHEMA.read_text())
    assert key_schema(report, RECORDS) == {name: keys for name, keys in schema.items()
                                           if name.startswith("unmeasured/")}
    _assert_round_trips(report, ("unmeasured",))
    entries = qdeploy.open_run(tmp_path / "out").unmeasured
    assert [(entry.kind, entry.target, entry.has("batch_size"), entry.allowed) for entry in entries] == [
        ("validate", "ort:cpu", False, True), ("validate", "reference:cpu", False, True),
        ("benchmark", "ort:cpu", True, False), ("benchmark", "ort:cpu", True, False)]
    assert entries[-1].reason == "throughput: RuntimeError: float16 session refused (test)"
