"""`qdeploy explain` on what a user hands it: a report.json edited by hand (the unsigned root: every reader
validates what it reads), a variant named as the recipe names it, a pair the run did not profile."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import onnx
import pytest
from typer.testing import CliRunner

from qdeploy.cli import app
from tests.helpers.models import tiny_cnn, write_recipe
from tests.robustness.helpers import assert_exit_2, qdeploy

RECIPE = """
    name: explained
    model: {onnx: model.onnx}
    data:
      calib: {reader: random, samples: 4}
    variants:
      fp32: [simplify]
      int8: [simplify, {quantize: {calibration: {data: calib}, per_runtime: true}}]
    targets: [ort:cpu, openvino:cpu]
    validate: {reference: fp32, samples: 2}
    benchmark: {enabled: false}
    report: {layers: auto, packages: {enabled: false}}
    """


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A run whose int8 is built per runtime (int8@ort, int8@openvino) and whose auto pass profiles fp32 only."""
    folder = tmp_path_factory.mktemp("explained")
    onnx.save(tiny_cnn(), folder / "model.onnx")
    code, stderr = qdeploy("run", str(write_recipe(folder, RECIPE)), "-q", "--out", str(folder / "out"))
    assert code == 0, stderr
    return json.loads((folder / "out" / "report.json").read_text())


def _lone(tmp_path: Path, report: dict[str, Any]) -> Path:
    path = tmp_path / "report.json"
    path.write_text(json.dumps(report))
    return path


def _pair(report: dict[str, Any]) -> dict[str, Any]:
    return report["layers"]["pairs"][0]


@pytest.mark.parametrize(("edit", "field"), [
    (lambda r: r.update(layers="everything"), "layers"),
    (lambda r: _pair(r).update(summary="fast"), "layers.pairs.0.summary"),
    (lambda r: _pair(r)["summary"].update(time_ms=None), "layers.pairs.0.summary.time_ms"),
    (lambda r: _pair(r)["top_time"][0].update(layer=None), "layers.pairs.0.top_time.0.layer"),
    (lambda r: _pair(r).update(rows_total=None), "layers.pairs.0"),
    (lambda r: r["layers"].update(pairs={"a": 1}), "layers.pairs"),
    (lambda r: r.update(seconds="long"), "seconds"),  # what explain reads beside the section
    (lambda r: r["validation"].insert(0, "ort:cpu"), "validation.0"),
])
def test_a_malformed_report_is_exit_2_naming_report_json_and_the_field(
        report: dict[str, Any], tmp_path: Path, edit: Callable[[dict[str, Any]], None], field: str) -> None:
    edited = json.loads(json.dumps(report))
    edit(edited)
    path = _lone(tmp_path, edited)
    assert_exit_2(qdeploy("explain", str(path)), str(path), f"field '{field}'", "not as qdeploy writes it")


def test_explain_takes_the_recipes_variant_name_and_says_how_to_profile_it(report: dict[str, Any],
                                                                           tmp_path: Path) -> None:
    path = _lone(tmp_path, report)
    assert {pair["variant"] for pair in report["layers"]["pairs"]} == {"fp32"}  # auto: what the verdict ships
    for variant in ("int8", "int8@ort"):
        said = CliRunner().invoke(app, ["explain", str(path), "--variant", variant])
        assert said.exit_code == 0, said.stderr
        assert "report: {layers: full}" in said.stdout and "is not in this run" not in said.stderr
    said = CliRunner().invoke(app, ["explain", str(path), "--variant", "int8"])
    assert "built per runtime as int8@ort, int8@openvino" in said.stdout, said.stdout
    assert_exit_2(qdeploy("explain", str(path), "--variant", "int16"), "variant 'int16' is not in this run")
    shown = CliRunner().invoke(app, ["explain", str(path), "--variant", "fp32", "--target", "ort:cpu"]).stdout
    assert "fp32 on ort:cpu" in shown and "most time" in shown
