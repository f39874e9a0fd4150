"""report.json's result rows: the same keys and value types as before the rows became typed models, and every
row parses into its model and serializes back to exactly the dict it came from."""

from __future__ import annotations

import json
from pathlib import Path

import qdeploy
from qdeploy.core.rows import BenchmarkRow, ThroughputRow, ValidationRow
from qdeploy.pipeline.loader import load_recipe
from qdeploy.pipeline.runner import RunOptions, run_recipe
from tests.helpers.models import write_recipe
from tests.helpers.report_keys import ROWS_RECIPE, key_schema

SCHEMA = Path(__file__).with_name("report_rows_schema.json")
MODELS = {"validation": ValidationRow, "benchmarks": BenchmarkRow, "throughput": ThroughputRow}


def test_rows_keep_the_keys_and_types_of_report_json_and_round_trip(tmp_path: Path) -> None:
    recipe = load_recipe(write_recipe(tmp_path, ROWS_RECIPE))
    result = run_recipe(recipe, RunOptions(out_dir=tmp_path / "out", show_progress=False))
    assert result.exit_code == 1  # int8 misses the strict cosine on purpose: a failed row with its divergence
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    # written by qdeploy before the typed rows (tests/helpers/report_keys.py says how); absent stays absent
    assert key_schema(report) == json.loads(SCHEMA.read_text())
    for section, model in MODELS.items():
        assert report[section], section
        for row in report[section]:
            assert model.from_json(row).to_json() == row, (section, row["variant"], row["target"])
    failed = next(row for row in report["validation"] if row["status"] == "failed")
    assert failed["variant"] == "int8" and failed["divergence"]["node"]
    opened = qdeploy.open_run(tmp_path / "out")
    assert [row.to_json() for row in opened.validation] == report["validation"]
    assert {row.status for row in opened.benchmarks} == {"ok", "unavailable"}
    assert all(row.mode == "throughput" for row in opened.throughput)
