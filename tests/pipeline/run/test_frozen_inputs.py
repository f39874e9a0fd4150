"""``model.inputs[].value`` through the whole recipe, and a target that cannot read the model said once.

The model (``tests.helpers.frozen``) is silero-vad's structure in small: OpenVINO cannot read it as exported (an
int64 scalar ``sr`` decides an If whose output rank the Conv after it needs).  Frozen at 16 kHz it runs on
openvino:cpu like on ONNX Runtime; not frozen, openvino:cpu is reported once as unable to read the original, its
rows are never 'passed', and the exit status follows the gates.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest

from qdeploy.calibration import DatasetSpec, data_context
from qdeploy.core.errors import DataError, RecipeError
from qdeploy.core.rows import ValidationRow
from qdeploy.pipeline.recipe.loader import load_recipe_file
from qdeploy.pipeline.report.verdict import verdict_section
from qdeploy.pipeline.report.verdict_words import verdict_lines
from qdeploy.pipeline.results.gates import excuse_unreadable, run_passes, validations_hold
from qdeploy.pipeline.run.runner import RunOptions, run_recipe
from qdeploy.stages import export
from qdeploy.stages.validate import unreadable_targets
from qdeploy.stages.validate._unreadable import condense_unreadable
from tests.helpers.frozen import RATE, SAMPLES, write_rate_if_model
from tests.helpers.models import write_recipe
from tests.helpers.report_keys import key_schema
from tests.helpers.reports import bench_row, check_row, report_with

RECIPE = """
    name: frozen
    model:
      onnx: rate_if.onnx
      {inputs}
    data:
      val: {{reader: npy, path: val}}
    variants:
      fp32: [simplify]
      fp16: [simplify, fp16]
      int8: [simplify, {{quantize: {{mode: ptq, calibration: {{data: val}}, per_runtime: false}}}}]
    targets: [ort:cpu, openvino:cpu]
    validate: {{data: val, samples: 4}}
    benchmark: {{batch_sizes: [1], warmup: 1, iterations: 2, rounds: 1}}
    {gates}
    """
FROZEN = "inputs: [{name: sr, value: 16000}]"
VARIANTS = ("exported", "fp32", "fp16", "int8")


def _folder(tmp_path: Path, rate: int = RATE) -> Path:
    write_rate_if_model(tmp_path)
    (tmp_path / "val").mkdir()
    for index in range(4):  # recorded with the rate, as silero-vad's own feeds are
        audio = np.random.default_rng(index).standard_normal((1, 1, SAMPLES)).astype(np.float32)
        np.savez(tmp_path / "val" / f"s{index}.npz", audio=audio, sr=np.array(rate, np.int64))
    return tmp_path


def _run(folder: Path, inputs: str = "", gates: str = "") -> tuple[dict[str, Any], int]:
    recipe = write_recipe(folder, RECIPE.format(inputs=inputs, gates=gates))
    result = run_recipe(load_recipe_file(recipe), RunOptions(out_dir=folder / "out", show_progress=False))
    return result.report, result.exit_code


def _rows(report: dict[str, Any], target: str) -> dict[str, dict[str, Any]]:
    return {row["variant"]: row for row in report["validation"] if row["target"] == target}


@pytest.mark.slow
def test_a_frozen_rate_runs_on_openvino_through_the_whole_recipe(tmp_path: Path) -> None:
    report, code = _run(_folder(tmp_path), FROZEN)
    assert code == 0 and report["failures"] == []
    assert report["unreadable_targets"] == {}
    rows = _rows(report, "openvino:cpu")
    assert {variant: rows[variant]["status"] for variant in VARIANTS} == dict.fromkeys(VARIANTS, "passed")
    assert all(rows[variant]["metrics"]["cosine"] > 0.99 for variant in VARIANTS)
    for artifact in report["artifacts"]:  # every artifact's lineage says what export froze and inlined
        export = artifact["lineage"][0]
        assert export["stage"] == "export"
        assert export["findings"]["frozen_inputs"] == {"sr": {"value": RATE, "dtype": "int64"}}
        assert export["findings"]["ifs_inlined"] == ["by_rate"]


@pytest.mark.slow
def test_a_target_that_cannot_read_the_model_is_said_once_and_fails_only_through_a_gate(tmp_path: Path) -> None:
    report, code = _run(_folder(tmp_path))
    assert list(report["unreadable_targets"]) == ["openvino:cpu"]
    why = report["unreadable_targets"]["openvino:cpu"]
    assert "cannot read the original model" in why and "Conv" in why
    rows = _rows(report, "openvino:cpu")
    assert all(rows[variant]["status"] == "unreadable" and rows[variant]["unreadable"] for variant in VARIANTS)
    schema = json.loads((Path(__file__).parents[2] / "core" / "report_rows_schema.json").read_text())
    assert key_schema(report)["validation/unreadable"] == schema["validation/unreadable"]  # the rows' report keys
    assert all(why not in rows[variant]["reason"] for variant in VARIANTS if variant != "exported")
    verdict = report["verdict"]
    assert verdict["unreadable"] == {"openvino:cpu": why} and "openvino:cpu" not in verdict["targets"]
    markdown = (tmp_path / "out" / "report.md").read_text()
    assert markdown.count(why) == 2  # the verdict's line and the failures' line, not one per variant
    html = (tmp_path / "out" / "report.html").read_text()
    assert "<code>openvino:cpu</code>: nothing to ship, not a failure of a variant" in html
    assert report["unmeasured"] == [] and code == 0 and report["passed"] is True  # ort:cpu holds: no regression

    gate = "gates: [{variant: int8, target: openvino:cpu, metric: cosine, min: 0.99}]"
    (tmp_path / "gated").mkdir()
    report, code = _run(_folder(tmp_path / "gated"), gates=gate)
    assert code == 1 and report["gates"][0]["passed"] is False
    assert "cannot read the original model" in report["gates"][0]["reason"]


def test_samples_hold_a_frozen_input_only_at_its_frozen_value(tmp_path: Path) -> None:
    """Feeds never carry the frozen input (the exported model has none); a sample recorded at the frozen rate is
    read with the key ignored, one recorded at another rate is refused, naming the file and the key."""
    folder = _folder(tmp_path)
    recipe = load_recipe_file(write_recipe(folder, RECIPE.format(inputs=FROZEN, gates="")))
    ctx = recipe.stage_context("exported", folder / "work")
    (folder / "work").mkdir()
    exported = folder / "exported.onnx"
    onnx.save(export.run(None, recipe.model, ctx).model, exported)
    feeds = list(ctx.samples("val", exported))
    assert len(feeds) == 4 and all(set(feed) == {"audio"} for feed in feeds)
    assert all(set(feed) == {"audio"} for feed in ctx.samples(None, exported, limit=2))  # random data: no sr
    (folder / "val" / "s0.npz").unlink()
    np.savez(folder / "val" / "s0.npz", audio=feeds[0]["audio"], sr=np.array(8000, np.int64))
    with pytest.raises(DataError, match=r"s0.npz: 'sr' holds 8000, but the recipe freezes input 'sr' to 16000"):
        list(ctx.samples("val", exported))
    plain = data_context("v", folder, datasets={"val": DatasetSpec(reader="npy", path=str(folder / "val"))})
    assert len(list(plain.samples("val", exported))) == 4  # without the recipe's freezing, keys it lacks are extra


def _row(variant: str, target: str, *, unreadable: bool = False, noise_floor: bool = False) -> ValidationRow:
    fields: dict[str, Any] = {"unreadable": True} if unreadable else {}
    reason = f"{target} cannot run this artifact: model.onnx: OpenVINO cannot read the model: rank" if unreadable \
        else ""
    return ValidationRow(variant=variant, target=target, status="failed" if unreadable else "passed", reason=reason,
                         noise_floor=noise_floor, **fields)


def test_rows_of_an_unreadable_original_point_to_one_line_and_are_no_regression() -> None:
    rows = condense_unreadable([_row("exported", "ort:cpu"), _row("int8", "ort:cpu"),
                                _row("exported", "openvino:cpu", unreadable=True, noise_floor=True),
                                _row("int8", "openvino:cpu", unreadable=True)])
    assert list(unreadable_targets(rows)) == ["openvino:cpu"]
    int8 = rows[3]
    assert int8.unreadable and "rank" not in int8.reason and "either" in int8.reason
    # the row, the summary and the exit status say the same: a limitation of the target, not a failed variant
    assert [row.status for row in rows[2:]] == ["unreadable", "unreadable"]
    assert validations_hold(rows) and run_passes([], rows, [], [])
    assert ValidationRow.from_json(int8.to_json()) == int8 and int8.to_json()["status"] == "unreadable"


def test_an_artifact_unreadable_where_the_original_reads_is_a_regression() -> None:
    rows = condense_unreadable([_row("exported", "openvino:cpu", noise_floor=True),
                                _row("int8", "openvino:cpu", unreadable=True)])
    assert unreadable_targets(rows) == {} and rows[1].unreadable is None and "rank" in rows[1].reason
    assert not validations_hold(rows)
    assert excuse_unreadable([], rows) == []


@pytest.mark.parametrize(("spec", "field", "message"), [
    ("{name: sr, value: sixteen}", "model.inputs.0", "value 'sixteen' is text"),
    ("{name: sr, value: [[1, 2], [3]]}", "model.inputs.0", "rectangular list of numbers"),
    ("{name: sr, value: .nan}", "model.inputs.0", "NaN or Inf"),
    ("{name: sr, value: 16000, low: 0, high: 1}", "model.inputs.0", "'low'/'high'"),
    ("{name: sr, value: [1, 2], shape: [3]}", "model.inputs.0", r"shape \[3\] contradicts its value of shape \[2\]"),
    ("{name: sr, value: 1.5, dtype: int64}", "model.inputs.0", "not whole"),
    ("{name: sr, value: missing.npy}", "model.inputs.0.value", "does not exist"),
])
def test_bad_values_are_refused_when_the_recipe_loads(tmp_path: Path, spec: str, field: str, message: str) -> None:
    write_rate_if_model(tmp_path)
    recipe = write_recipe(tmp_path, f"name: t\nmodel: {{onnx: rate_if.onnx, inputs: [{spec}]}}\nvariants: {{a: []}}\n")
    with pytest.raises(RecipeError, match=message) as caught:
        load_recipe_file(recipe)
    assert caught.value.field == field and caught.value.exit_code == 2


def test_qdeploy_check_names_a_frozen_input_the_model_lacks(tmp_path: Path) -> None:
    write_rate_if_model(tmp_path)
    recipe = write_recipe(tmp_path, "name: t\nmodel: {onnx: rate_if.onnx, inputs: [{name: rate, value: 8000}]}\n"
                                    "variants: {a: []}\n")
    result = subprocess.run([sys.executable, "-m", "qdeploy", "check", str(recipe)], capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 2, result.stderr
    assert "'rate'" in result.stderr and "['audio', 'sr']" in result.stderr and "Traceback" not in result.stderr


def test_a_torch_model_cannot_freeze_an_input(tmp_path: Path) -> None:
    (tmp_path / "net.py").write_text("def build():\n    raise AssertionError\n")
    recipe = write_recipe(tmp_path, "name: t\nmodel:\n  torch: {factory: 'net.py:build'}\n  inputs: [{name: x, "
                                    "shape: [1, 3]}, {name: sr, value: 16000}]\nvariants: {a: []}\n")
    with pytest.raises(RecipeError, match="bind the argument in the factory"):
        load_recipe_file(recipe)


def _verdict_report(readable_int8: bool) -> dict[str, Any]:
    """fp32 (the reference) cannot be read on openvino:cpu; int8 is read there or not."""
    report = {"validation": [check_row("fp32", "ort:cpu", 1.0, 200.0), check_row("int8", "ort:cpu", 0.99, 30.0),
                             {**check_row("fp32", "openvino:cpu", 0, 0, status="unreadable"), "metrics": {},
                              "unreadable": True, "noise_floor": True}],
              "benchmarks": [bench_row("fp32", "ort:cpu", 4.0, [4.0]), bench_row("int8", "ort:cpu", 2.0, [2.0])],
              "gates": [], "failures": [], "artifacts": [{"name": "fp32", "size_bytes": 4}, {"name": "int8",
                                                                                           "size_bytes": 1}],
              "unreadable_targets": {"openvino:cpu": "openvino:cpu cannot read the original model: rank"}}
    if readable_int8:
        report["validation"].append(check_row("int8", "openvino:cpu", 0.99, 30.0))
        report["benchmarks"].append(bench_row("int8", "openvino:cpu", 2.0, [2.0]))
    else:
        report["validation"].append({**check_row("int8", "openvino:cpu", 0, 0, status="unreadable"), "metrics": {},
                                     "unreadable": True})
    return report_with(**report)


def test_the_verdict_says_an_unreadable_target_once_and_ships_what_reads_there() -> None:
    section = verdict_section(_verdict_report(readable_int8=False))
    assert list(section["targets"]) == ["ort:cpu"] and list(section["unreadable"]) == ["openvino:cpu"]
    lines = [headline for headline, _ in verdict_lines(section)]
    assert sum("openvino:cpu" in line for line in lines) == 1 and "nothing to ship" in lines[-1]
    section = verdict_section(_verdict_report(readable_int8=True))  # simplify made int8 readable there
    assert section["targets"]["openvino:cpu"]["variant"] == "int8" and "openvino:cpu" in section["unreadable"]
