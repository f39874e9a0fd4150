"""The command line as a user runs it: the demo end to end, exit codes, messages without tracebacks."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.models import DEMO_RECIPE, write_recipe


def qdeploy(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "qdeploy", *args], capture_output=True, text=True,
                          cwd=cwd, timeout=600)


@pytest.mark.slow
def test_demo_end_to_end_then_cached(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    first = qdeploy("run", str(DEMO_RECIPE), "--out", str(out), "-q")
    assert first.returncode == 0, first.stderr
    report = json.loads((out / "report.json").read_text())
    assert (out / "report.md").is_file()
    rows = {(row["variant"], row["target"]): row for row in report["validation"]}
    for variant in ("fp32", "fp16", "int8"):  # per_runtime auto: the demo's int8 is one build per runtime
        for target in ("ort:cpu", "openvino:cpu"):
            built = variant if variant != "int8" else f"int8@{target.partition(':')[0]}"
            assert rows[(built, target)]["status"] == "passed", rows[(built, target)]
        for target in ("ort:cuda", "openvino:gpu"):
            built = variant if variant != "int8" else f"int8@{target.partition(':')[0]}"
            assert rows[(built, target)]["status"] == "unavailable"
    openvino = rows[("fp32", "openvino:cpu")]
    assert openvino["execution"]["precision"] == "f32"  # pinned, whatever the CPU supports
    bench = {(row["variant"], row["target"]): row for row in report["benchmarks"]}
    int8 = bench[("int8@ort", "ort:cpu")]
    assert int8["status"] == "ok" and int8["round_runs"][:5] == [20] * 5  # the demo's 100 runs, then any extra round
    assert all(gate["passed"] for gate in report["gates"])
    first_seconds = sum(step["seconds"] for a in report["artifacts"] for step in a["lineage"] if not step["cached"])
    assert first_seconds > 0

    second = qdeploy("run", str(DEMO_RECIPE), "--out", str(out), "-q", "--target", "ort:cpu")
    assert second.returncode == 0, second.stderr
    again = json.loads((out / "report.json").read_text())
    assert all(a["cached"] for a in again["artifacts"])
    assert {row["target"] for row in again["benchmarks"]} == {"ort:cpu"}


@pytest.mark.parametrize(
    ("edit", "needle"),
    [
        (("keep_io_types", "keep_io_typez"), "unknown field 'keep_io_typez'"),
        (("models/demo_cnn.onnx", "models/nope.onnx"), "does not exist"),
        (("fp32: [simplify]", "fp32: [simplifi]"), "unknown stage 'simplifi'"),
        (("ort:cuda", "ort:cudaa"), "ort:cudaa"),
    ],
)
def test_check_reports_bad_recipes_with_line_and_exit_2(tmp_path: Path, edit: tuple[str, str], needle: str) -> None:
    text = DEMO_RECIPE.read_text().replace(*edit)
    recipe = write_recipe(DEMO_RECIPE.parent, text, name=f".test-{tmp_path.name}.yaml")
    try:
        result = qdeploy("check", str(recipe))
    finally:
        recipe.unlink()
    assert result.returncode == 2
    assert needle in result.stderr
    assert f"{recipe}:" in result.stderr  # file and line
    assert "Traceback" not in result.stderr


def test_check_prints_plan() -> None:
    result = qdeploy("check", str(DEMO_RECIPE))
    assert result.returncode == 0, result.stderr
    assert "recipe demo-cnn: valid" in result.stdout and "ort:cuda: unavailable" in result.stdout


def test_run_of_a_broken_model_exits_2_without_traceback(tmp_path: Path) -> None:
    (tmp_path / "bad.onnx").write_bytes(b"this is not a protobuf at all" * 10)
    recipe = write_recipe(tmp_path, "name: t\nmodel: {onnx: bad.onnx}\nvariants: {a: []}\n")
    result = qdeploy("run", str(recipe), "--out", str(tmp_path / "out"), "-q")
    assert result.returncode == 2
    assert "bad.onnx" in result.stderr and "Traceback" not in result.stderr


def test_schema_and_doctor() -> None:
    schema = json.loads(qdeploy("schema").stdout)
    assert "variants" in schema["properties"] and "fp16_config" in schema["$defs"]
    report = json.loads(qdeploy("schema", "--report").stdout)  # report.json's, generated from its model
    assert report["title"] == "qdeploy report.json" and {"validation", "verdict"} <= set(report["properties"])
    doctor = qdeploy("doctor", "--json")
    env = json.loads(doctor.stdout)
    assert env["targets"]["ort:cpu"] == "available"
    assert env["targets"]["ort:cuda"].startswith("unavailable")
