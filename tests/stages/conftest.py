"""Fixtures shared by the stage tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from qdeploy.core.context import StageContext
from qdeploy.pipeline.recipe.schema import Recipe


@pytest.fixture
def ctx(tmp_path: Path) -> StageContext:
    """A stage context on a minimal recipe, its scratch folder under tmp_path."""
    recipe = Recipe(name="t", model={"onnx": "m.onnx"}, variants={"v": []})
    return recipe.stage_context("v", tmp_path / "work")
