"""A budget's task-metric tolerance without a metric of its own uses the recipe's validate.metric."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper

from qdeploy.core.errors import RecipeError
from qdeploy.core.tolerance import TaskTolerance
from qdeploy.pipeline.recipe.loader import parse_recipe
from qdeploy.pipeline.recipe.schema import Recipe
from tests.helpers.quantize import init, make_model

RECIPE = """
name: t
model: {{onnx: m.onnx}}
data:
  val: {{reader: npy, path: val}}
variants:
  half: [{{fp16: {{mode: auto, calibration: {{data: val}}, tolerance: {{max_drop: 0.01}}}}}}]
  int8: [{{quantize: {{calibration: {{data: val}}, tolerance: {{{own}max_relative_drop: 0.02}}}}}}]
targets: [ort:cpu]
{validate}
"""


def parse(tmp_path: Path, own: str, validate: str) -> Recipe:
    onnx.save(make_model([helper.make_node("Gemm", ["x", "w"], ["y"], name="fc")], [init("w", np.eye(4))],
                         {"x": [1, 4]}, {"y": [1, 4]}), tmp_path / "m.onnx")
    (tmp_path / "val").mkdir(exist_ok=True)
    np.savez(tmp_path / "val" / "0.npz", x=np.ones((1, 4), np.float32), label=np.array([0]))
    for name in ("metrics.py", "own.py"):
        (tmp_path / name).write_text("def accuracy(outputs, labels):\n    return 1.0\n\n\ntop5 = accuracy\n")
    return parse_recipe(RECIPE.format(own=own, validate=validate), source=tmp_path / "recipe.yaml")


def test_a_tolerance_without_a_metric_gets_validate_metric(tmp_path: Path) -> None:
    recipe = parse(tmp_path, "", "validate: {data: val, metric: 'metrics.py:accuracy'}")
    for variant in ("half", "int8"):
        tolerance = recipe.variants[variant][0].config.tolerance  # type: ignore[attr-defined]
        assert isinstance(tolerance, TaskTolerance) and tolerance.metric == "metrics.py:accuracy"
    assert recipe.variants["int8"][0].config.tolerance.max_relative_drop == 0.02  # type: ignore[attr-defined]
    dumped = recipe.model_dump(mode="json", by_alias=True)["variants"]["half"][0]["config"]["tolerance"]
    assert dumped["metric"] == "metrics.py:accuracy"  # what the cache key and the plan hash


def test_its_own_metric_wins(tmp_path: Path) -> None:
    recipe = parse(tmp_path, "metric: 'own.py:top5', ", "validate: {data: val, metric: 'metrics.py:accuracy'}")
    assert recipe.variants["int8"][0].config.tolerance.metric == "own.py:top5"  # type: ignore[attr-defined]


def test_no_metric_anywhere_is_a_recipe_error_naming_the_step(tmp_path: Path) -> None:
    with pytest.raises(RecipeError, match=r"names no metric and validate\.metric is not set") as caught:
        parse(tmp_path, "", "")
    assert caught.value.field == "variants.half.0.fp16.tolerance.metric"
