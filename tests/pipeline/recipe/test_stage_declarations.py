"""The pipeline asks a stage's settings what it needs through their declarations (``qdeploy.core.stage_config``)
and never sniffs them: no ``getattr``/``hasattr`` on a config anywhere under pipeline/."""

from __future__ import annotations

import ast
import re

from qdeploy.core.stage_config import StageConfig
from qdeploy.pipeline.recipe import registry
from qdeploy.pipeline.recipe.loader import recipe_python_references
from qdeploy.pipeline.recipe.schema import Recipe
from qdeploy.pipeline.run.memory_plan import OPENVINO_DYNAMIC, stages_of
from tests.helpers.imports import ROOT

CONFIG_LIKE = re.compile(r"config|recipe|validate_|benchmark|\bstep\b")


def _sniffs(source: str) -> list[str]:
    """``getattr``/``hasattr`` calls whose object looks like a stage's settings, with their line."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr") \
                and node.args and CONFIG_LIKE.search(ast.unparse(node.args[0])):
            found.append(f"{node.lineno}: {ast.unparse(node)}")
    return found


def test_the_pipeline_never_sniffs_a_stage_config() -> None:
    sniffing = {str(path.relative_to(ROOT)): hits for path in sorted((ROOT / "pipeline").rglob("*.py"))
                if (hits := _sniffs(path.read_text(encoding="utf-8")))}
    assert sniffing == {}, "ask the config's declaration (qdeploy.core.stage_config.StageConfig) instead"


def test_the_check_sees_sniffing() -> None:
    assert _sniffs('getattr(step.config, "tolerance", None)\nhasattr(config, "mode")\ngetattr(row, "x")') == [
        "1: getattr(step.config, 'tolerance', None)", "2: hasattr(config, 'mode')"]


def test_every_stage_declares_through_the_one_base() -> None:
    for info in registry.all_stages():
        models = [model for _, model in info.modes] or [info.config]
        assert all(issubclass(model, StageConfig) for model in models), info.name


def _recipe(variants: dict, **more: object) -> Recipe:
    return Recipe.model_validate({"name": "r", "model": {"onnx": "m.onnx"}, "variants": variants, **more})


def test_the_pipeline_acts_on_the_declarations() -> None:
    dynamic = _recipe({"dyn": [{"quantize": {"mode": "dynamic"}}], "fp16": ["fp16"]},
                      targets=["ort:cpu", "openvino:cpu"])
    assert OPENVINO_DYNAMIC in stages_of(dynamic, ["dyn"]) and OPENVINO_DYNAMIC not in stages_of(dynamic, ["fp16"])
    budgets = _recipe({"int8": [{"quantize": {"tolerance": {"max_drop": 0.01}}}],
                       "half": [{"fp16": {"mode": "auto", "calibration": {}, "tolerance": {
                           "metric": "own.py:top5", "max_drop": 0.02}}}]},
                      validate={"metric": "metrics.py:accuracy"})
    assert recipe_python_references(budgets) == [
        {"field": "validate.metric", "code": "metrics.py:accuracy"},
        {"field": "variants.int8.quantize.tolerance.metric", "code": "metrics.py:accuracy"},
        {"field": "variants.half.fp16.tolerance.metric", "code": "own.py:top5"}]
