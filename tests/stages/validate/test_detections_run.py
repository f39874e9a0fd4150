"""A detector with NonMaxSuppression inside through the recipe, its outputs matched by IoU (validate.detections):
validation rows, a gate on detections_matched, the package's own check, and the accuracy budgets of int8 and
fp16, which compare the same way (before, every comparison failed on the outputs' lengths and the budgets kept
the whole model float)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest

from qdeploy.pipeline.recipe.loader import load_recipe_file
from qdeploy.pipeline.run.runner import RunOptions, RunOutcome, run_recipe
from qdeploy.stages.validate.config import Detections
from tests.helpers.detector import SIZE, detector_model
from tests.helpers.models import write_recipe
from tests.helpers.packages import without_qdeploy

DETECTIONS = "{boxes: boxes, scores: scores, labels: labels"


def _run(folder: Path, body: str) -> RunOutcome:
    onnx.save(detector_model(), str(folder / "model.onnx"))
    rng = np.random.default_rng(3)
    for split in ("calib", "val"):
        (folder / split).mkdir()
        for index in range(8):
            np.save(folder / split / f"{index}.npy", rng.standard_normal((1, 3, SIZE, SIZE)).astype(np.float32))
    recipe = load_recipe_file(write_recipe(folder, body))
    return run_recipe(recipe, RunOptions(out_dir=folder / "out", show_progress=False))


def _row(result: RunOutcome, variant: str, target: str = "ort:cpu") -> dict[str, Any]:
    return next(row for row in result.report["validation"] if row["variant"] == variant and row["target"] == target)


REFERENCE_RECIPE = """
    name: detector
    model: {{onnx: model.onnx}}
    data: {{val: {{reader: npy, path: val}}}}
    variants: {{fp32: []}}
    targets: [ort:cpu]
    validate: {{data: val, reference_model: reference.onnx, detections: {detections}, match_min: {match_min}}}}}
    benchmark: {{enabled: false}}
    gates: [{{variant: fp32, target: "ort:cpu", metric: detections_matched, min: {gate}}}]
    """


def _against_lower_threshold(folder: Path, match_min: float, gate: float) -> RunOutcome:
    """The artifact keeps boxes scoring above 0.5; the reference model (the same weights) above 0.4: it returns
    more boxes, and every box of the artifact is among them."""
    onnx.save(detector_model(score_threshold=0.4), str(folder / "reference.onnx"))
    return _run(folder, REFERENCE_RECIPE.format(detections=DETECTIONS, match_min=match_min, gate=gate))


def test_boxes_are_matched_by_iou_and_a_gate_holds_the_share_matched(tmp_path: Path) -> None:
    result = _against_lower_threshold(tmp_path, match_min=0.5, gate=0.5)
    row = _row(result, "fp32")
    assert row["status"] == "passed", row["reason"]
    found = row["outputs"][0]["detections"]
    assert [output["name"] for output in row["outputs"]] == ["boxes"]  # scores and labels are part of the match
    assert found["precision"] == 1.0 and found["mean_iou"] == 1.0 and found["max_score_diff"] == 0.0
    assert found["candidate_detections"] < found["reference_detections"]
    assert row["metrics"]["detections_matched"] == pytest.approx(found["recall"]) and found["recall"] < 1.0
    assert result.exit_code == 0
    report_md = (result.out_dir / "report.md").read_text()
    assert f"{found['recall']:.1%} boxes" in report_md  # the cosine column of a detector


def test_too_few_matches_fail_the_row_and_a_gate_fails_the_run(tmp_path: Path) -> None:
    result = _against_lower_threshold(tmp_path, match_min=0.99, gate=0.99)
    row = _row(result, "fp32")
    assert row["status"] == "failed"
    assert "detections 'boxes': recall" in row["reason"] and "< match_min 0.99" in row["reason"]
    assert result.exit_code != 0
    gate = result.report["gates"][0]
    assert gate["metric"] == "detections_matched" and not gate["passed"]


BUDGET_RECIPE = """
    name: detector
    model: {{onnx: model.onnx}}
    data: {{calib: {{reader: npy, path: calib}}, val: {{reader: npy, path: val}}}}
    variants:
      int8: [{{quantize: {{mode: ptq, calibration: {{data: calib}}, tolerance: {{cosine_min: 0.999}}}}}}]
      fp16: [{{fp16: {{mode: auto, calibration: {{data: calib}}, tolerance: {{cosine_min: 0.9999}}}}}}]
    targets: [ort:cpu]
    validate: {{data: val, detections: {detections}, match_min: 0.5}}}}
    benchmark: {{enabled: false}}
    """


def test_budgets_match_boxes_as_validation_does_and_the_package_checks_them(tmp_path: Path) -> None:
    """match_min 0.5 is far below what int8 and float16 keep of these boxes on any CPU: the fully reduced models
    meet it, where an elementwise comparison of outputs of other lengths failed every candidate."""
    result = _run(tmp_path, BUDGET_RECIPE.format(detections=DETECTIONS))
    artifacts = result.out_dir / "artifacts"
    int8 = json.loads((artifacts / "int8.json").read_text())["findings"]["budget"]
    assert int8["met"] and int8["kept_float"] == [], int8["final"]
    assert int8["final"]["held_back"]["detections_matched"] >= 0.5
    assert "(detections matched" in int8["confirmed"] and "ort:cpu: confirmed (detections matched" in int8["confirmed"]
    fp16 = json.loads((artifacts / "fp16.json").read_text())["findings"]["budget"]
    assert fp16["met"] and fp16["float32_nodes"] == []
    assert fp16["metrics_all_float16"]["detections_matched"] >= 0.5
    for variant in ("int8", "fp16"):
        assert _row(result, variant)["status"] == "passed"
    written = result.report["packages"]["written"]
    assert written, result.report["packages"]
    folder = Path(written[0]["path"])
    assert (folder / "detections.py").is_file()
    done = without_qdeploy(folder, "--require-no-qdeploy")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "detections boxes:" in done.stdout and done.stdout.rstrip().endswith("PASS")
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["check"]["tolerances"]["boxes"]["match_min"] = 1.01  # a limit no match can meet: the check fails
    (folder / "manifest.json").write_text(json.dumps(manifest))
    assert without_qdeploy(folder).returncode == 1  # the check holds the manifest's match limits


def test_a_detections_spec_is_checked_when_the_recipe_loads(tmp_path: Path) -> None:
    onnx.save(detector_model(), str(tmp_path / "model.onnx"))
    for spec, said in (("{scores: scores}", "boxes"), ("{boxes: boxes, box_format: yxyx}", "box_format"),
                       ("{boxes: boxes, iou: 0.5}", "iou"), ("{boxes: boxes, match_min: 2}", "match_min")):
        body = f"name: d\nmodel: {{onnx: model.onnx}}\nvariants: {{fp32: []}}\nvalidate: {{detections: {spec}}}\n"
        with pytest.raises(Exception, match=f"validate.detections.*{said}"):  # RecipeError, naming the field
            load_recipe_file(write_recipe(tmp_path, body))
    assert Detections(boxes="det[0:4]", scores="det[4]").score_threshold == 0.0  # padding rows left out
    with pytest.raises(ValueError, match="name an output"):
        Detections(boxes="[0:4]")


@pytest.mark.parametrize(("section", "field"), [("detections: {boxes: boxs}", "validate.detections.boxes"),
                                                 ("detections: {boxes: 'boxes[0:4]', scores: score}",
                                                  "validate.detections.scores"),
                                                 ("outputs: {label: {mismatch_max: 0.1}}", "validate.outputs.label")])
def test_an_output_the_model_lacks_is_refused_before_any_variant_is_built(tmp_path: Path, section: str,
                                                                          field: str) -> None:
    body = (f"name: d\nmodel: {{onnx: model.onnx}}\nvariants: {{int8: [{{quantize: {{mode: ptq}}}}]}}\n"
            f"targets: [ort:cpu]\nvalidate: {{{section}}}\nbenchmark: {{enabled: false}}\n")
    with pytest.raises(Exception, match="the model has no output") as raised:  # RecipeError: exit 2
        _run(tmp_path, body)
    assert getattr(raised.value, "field", None) == field
    assert "its outputs: boxes, scores, labels" in str(raised.value)
    assert not (tmp_path / "out" / "artifacts").exists()  # nothing was published
