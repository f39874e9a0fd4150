"""A budget on a task metric is cached by the metric file's content: editing metrics.py rebuilds the variant."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
from onnx import helper

from qdeploy.pipeline.recipe.loader import load_recipe_file
from qdeploy.pipeline.results.identity import code_fingerprint
from qdeploy.pipeline.run.runner import RunOptions, run_recipe
from tests.helpers.models import write_recipe
from tests.helpers.quantize import init, make_model

RECIPE = """
name: t
model: {onnx: m.onnx}
data:
  val: {reader: npy, path: val}
variants:
  half: [{fp16: {mode: auto, calibration: {data: val}, tolerance: {max_drop: 0.5}}}]
targets: [ort:cpu]
validate: {data: val, metric: "metrics.py:accuracy"}
benchmark: {enabled: false}
"""
METRIC = "import numpy as np\n\n\ndef accuracy(outputs, labels):\n    return {value}\n"


def recipe(tmp_path: Path) -> Path:
    onnx.save(make_model([helper.make_node("Gemm", ["x", "w"], ["logits"], name="fc")], [init("w", np.eye(4))],
                         {"x": [1, 4]}, {"logits": [1, 4]}), tmp_path / "m.onnx")
    (tmp_path / "val").mkdir()
    for index in range(2):
        np.savez(tmp_path / "val" / f"{index}.npz", x=np.ones((1, 4), np.float32), label=np.array([index]))
    (tmp_path / "metrics.py").write_text(METRIC.format(value="1.0"))
    return write_recipe(tmp_path, RECIPE)


def fp16_cached(path: Path, out: Path) -> bool:
    run_recipe(load_recipe_file(path), RunOptions(out_dir=out, show_progress=False))
    report = json.loads((out / "report.json").read_text())
    artifact = next(a for a in report["artifacts"] if a["name"] == "half")
    return next(step["cached"] for step in artifact["lineage"] if step["stage"] == "fp16")


def test_editing_the_metric_file_rebuilds_the_variant(tmp_path: Path) -> None:
    path = recipe(tmp_path)
    assert fp16_cached(path, tmp_path / "out") is False
    assert fp16_cached(path, tmp_path / "out") is True
    (tmp_path / "metrics.py").write_text(METRIC.format(value="float(np.float32(1.0))"))  # same path, new code
    assert fp16_cached(path, tmp_path / "out") is False


def test_the_fingerprint_is_the_files_content_or_the_modules_name(tmp_path: Path) -> None:
    recipe_ = load_recipe_file(recipe(tmp_path))
    config = recipe_.variants["half"][0].config
    before = code_fingerprint(recipe_, config)
    assert before["code"]["tolerance.metric"][1] == "accuracy"
    (tmp_path / "metrics.py").write_text(METRIC.format(value="0.5"))
    assert code_fingerprint(recipe_, config) != before
    named = config.model_copy(update={"tolerance": config.tolerance.model_copy(  # type: ignore[attr-defined]
        update={"metric": "sklearn.metrics:accuracy_score"})})
    assert code_fingerprint(recipe_, named) == {"code": {"tolerance.metric": "sklearn.metrics:accuracy_score"}}
    assert code_fingerprint(recipe_, config.model_copy(update={"tolerance": None})) == {}
