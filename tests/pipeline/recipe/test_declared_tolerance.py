"""A variant built to an accuracy budget is validated against that budget's tolerance, not a stricter default.

The int8 default (cosine 0.98 and SNR 15 dB) used to judge a variant whose recipe asked only for cosine 0.98:
silero-vad's budget met cosine 0.98 and validation failed it on an SNR limit nobody had set."""

from __future__ import annotations

from pathlib import Path

import onnx

from qdeploy.pipeline.recipe.loader import load_recipe_file
from qdeploy.pipeline.run.runner import RunOptions, run_recipe
from qdeploy.stages.validate import DECLARED_BASIS
from tests.helpers.models import write_recipe
from tests.helpers.quantize import tiny_conv

RECIPE = """
    name: declared
    model: {{onnx: float.onnx}}
    variants:
      int8: [{{quantize: {{tolerance: {{cosine_min: 0.5}}, reduce_range: weights}}}}]
      plain: [{{quantize: {{reduce_range: weights}}}}]
    targets: [ort:cpu]
    validate: {{samples: 2{validate}}}
    benchmark: {{enabled: false}}
    """


def _rows(tmp_path: Path, validate: str) -> dict[str, dict]:
    onnx.save(tiny_conv(), str(tmp_path / "float.onnx"))
    recipe = load_recipe_file(write_recipe(tmp_path, RECIPE.format(validate=validate)))
    assert set(recipe.declared_tolerances()) == {"int8"}
    result = run_recipe(recipe, RunOptions(out_dir=tmp_path / "run", show_progress=False))
    return {row["variant"]: row for row in result.report["validation"] if row["target"] == "ort:cpu"}


def test_a_budgeted_variant_is_held_to_its_own_tolerance(tmp_path: Path) -> None:
    rows = _rows(tmp_path, "")
    assert rows["int8"]["tolerance"] == {"cosine_min": 0.5}
    assert rows["int8"]["tolerance_basis"] == DECLARED_BASIS
    assert rows["plain"]["tolerance"] == {"cosine_min": 0.98, "snr_db_min": 15.0}  # the int8 default


def test_the_budget_wins_over_validate_tolerance_for_its_variant_only(tmp_path: Path) -> None:
    rows = _rows(tmp_path, ", tolerance: {cosine_min: 0.9}")
    assert rows["int8"]["tolerance"] == {"cosine_min": 0.5}
    assert rows["plain"]["tolerance"] == {"cosine_min": 0.9}
