"""A runtime that ends the process while a new artifact is first loaded (a segmentation fault in ONNX Runtime's
optimisers or OpenVINO's CPU plugin) fails that variant with the reason; the run goes on, reports and publishes the
others.  The crash is real (a child segfaults) and injected where the loads of a run happen."""

from __future__ import annotations

import json
from pathlib import Path

from tests.robustness.helpers import RECIPE, recipe_with_model, run_cli

CRASH = ("import qdeploy.targets.{module} as probe\nfrom tests.helpers.fresh import crashing_on\n"
         "probe.call_isolated = crashing_on('{part}', '{runtime}')")
CRASH_ORT_ON_INT8 = CRASH.format(module="ort_probe", part="quantized.onnx", runtime="onnxruntime")
CRASH_OPENVINO_ON_INT8 = CRASH.format(module="openvino_probe", part="int8@openvino", runtime="openvino")


def _run(tmp_path: Path, crash: str, body: str = RECIPE) -> tuple[int, dict]:
    recipe = recipe_with_model(tmp_path, body=body)
    result = run_cli("run", str(recipe), "-q", "--out", str(tmp_path / "o"), code=crash)
    assert "Traceback" not in result.stderr, result.stderr[-2000:]
    return result.returncode, json.loads((tmp_path / "o" / "report.json").read_text())


def _statuses(report: dict) -> dict[tuple[str, str], str]:
    return {(row["variant"], row["target"]): row["status"] for row in report["validation"]}


def test_onnx_runtime_crashing_on_the_int8_artifact_fails_int8_only(tmp_path: Path) -> None:
    code, report = _run(tmp_path, CRASH_ORT_ON_INT8)
    assert code == 1
    failure = next(item for item in report["failures"] if item["variant"] == "int8")
    assert "ONNX Runtime crashed loading it" in failure["reason"] and "signal 11" in failure["reason"]
    assert _statuses(report) == {("fp32", "ort:cpu"): "passed"}


def test_openvino_crashing_on_the_int8_artifact_fails_int8_only(tmp_path: Path) -> None:
    body = RECIPE.replace("targets: [ort:cpu]", "targets: [ort:cpu, openvino:cpu]")
    code, report = _run(tmp_path, CRASH_OPENVINO_ON_INT8, body)
    assert code == 1
    failure = next(item for item in report["failures"] if item["variant"] == "int8@openvino")
    assert "OpenVINO crashed reading or compiling it" in failure["reason"], failure
    assert _statuses(report) == {("fp32", "ort:cpu"): "passed", ("fp32", "openvino:cpu"): "passed",
                                 ("int8@ort", "ort:cpu"): "passed"}


def test_openvino_crashing_on_the_reference_makes_it_an_unreadable_target_not_the_end_of_the_run(
        tmp_path: Path) -> None:
    """The artifacts as validation reads them from the cache (the guard saw its own copies, which compile): the
    OpenVINO target checks each small file in the worker child before it compiles it in the run's process, and a
    target that cannot compile the reference is reported as unreadable, as for a refusal."""
    body = RECIPE.replace("targets: [ort:cpu]", "targets: [ort:cpu, openvino:cpu]")
    crash = CRASH.format(module="openvino_probe", part="/cache/", runtime="openvino")
    code, report = _run(tmp_path, crash, body)
    assert code == 0  # a target that cannot read the reference is reported once, not a failure of the variants
    assert _statuses(report) == {("fp32", "ort:cpu"): "passed", ("int8@ort", "ort:cpu"): "passed",
                                 ("fp32", "openvino:cpu"): "unreadable",
                                 ("int8@openvino", "openvino:cpu"): "unreadable"}
    assert "OpenVINO crashed reading or compiling it" in json.dumps(report["unreadable_targets"])
