"""report.json as one typed model (issue 41): a report read back writes the JSON it was read from, its schema
(``qdeploy schema --report``) holds the stored demo report, and a malformed one is an input error."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from qdeploy.core.errors import QdeployInputError
from qdeploy.core.report import Report, as_report, report_schema
from qdeploy.core.rows import BenchmarkRow, ValidationRow
from tests.helpers.demo_report import DEMO_REPORT, demo_report, mixed_rows_report


def test_the_demo_report_reads_back_to_the_same_json() -> None:
    """An older run's report.json (the stored demo) parses and writes exactly its keys and values."""
    stored = demo_report()
    report = Report.model_validate_json(DEMO_REPORT.read_bytes())
    assert report.to_json() == stored
    assert as_report(stored).to_json() == stored


def test_a_report_with_rows_that_differ_per_target_reads_back_the_same() -> None:
    report = mixed_rows_report()
    assert as_report(report).to_json() == report


def test_sections_read_as_attributes() -> None:
    report = as_report(demo_report())
    assert isinstance(report.validation[0], ValidationRow) and isinstance(report.benchmarks[0], BenchmarkRow)
    assert report.reference.variant == "fp32" and report.verdict is not None
    assert report.verdict.targets["ort:cpu"].variant == "int8"
    assert report.artifacts[0].lineage[0].stage == "export"
    assert report.environment is not None and report.environment.cpu.cores >= 1
    assert report.packages is not None and report.packages.written[0].checked
    assert report.layers is None and report.throughput == []  # written before the layers section existed
    assert "layers" not in report.to_json()


def test_the_schema_holds_the_demo_report() -> None:
    schema = report_schema()
    jsonschema.validate(demo_report(), schema)
    assert schema["title"] == "qdeploy report.json"
    assert {"validation", "benchmarks", "verdict", "artifacts"} <= set(schema["properties"])


def test_the_schema_refuses_a_row_without_its_status() -> None:
    report = demo_report()
    del report["validation"][0]["status"]
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(report, report_schema())


def test_a_malformed_report_is_an_input_error(tmp_path: Path) -> None:
    report = demo_report()
    report["artifacts"][0]["size_bytes"] = "large"
    path = tmp_path / "report.json"
    path.write_text(json.dumps(report))
    with pytest.raises(QdeployInputError, match=r"artifacts\.0\.size_bytes"):
        Report.load(path)
    report["artifacts"][0]["size_bytes"], report["surprise"] = 1, True
    with pytest.raises(QdeployInputError, match="surprise"):
        as_report(report)
