"""An fp16 budget's promise is confirmed where validation will check it: the recipe's targets, and reference:cpu
(true float16 arithmetic) where validation adds that check; nothing else is given it."""

from __future__ import annotations

import json
from pathlib import Path

import onnx
import pytest

from qdeploy.pipeline.recipe.loader import load_recipe_file
from qdeploy.pipeline.run.runner import RunOptions, run_recipe
from tests.helpers.models import tiny_cnn, write_recipe

RECIPE = """
    name: checked
    model: {onnx: tiny.onnx}
    data: {calib: {reader: random, samples: 6, seed: 1}}
    variants:
      fp16: [{fp16: {mode: auto, calibration: {data: calib}, tolerance: {snr_db_min: 40}}}]
      int8: [{quantize: {calibration: {data: calib}, tolerance: {cosine_min: 0.9}}}]
    targets: TARGETS
    validate: {fp16_reference: MODE}
    benchmark: {enabled: false}
    """


def _recipe(tmp_path: Path, targets: str, mode: str = "auto") -> Path:
    onnx.save(tiny_cnn(), tmp_path / "tiny.onnx")
    return write_recipe(tmp_path, RECIPE.replace("TARGETS", targets).replace("MODE", mode))


@pytest.mark.parametrize(("targets", "mode", "expected"), [
    ("[ort:cpu]", "auto", ("ort:cpu", "reference:cpu")),      # no GPU here: validation checks true float16
    ("[ort:cpu]", "never", ("ort:cpu",)),
    ("[ort:cpu, reference:cpu]", "auto", ("ort:cpu", "reference:cpu")),  # named once, not twice
    ("[ort:cpu, ort:cuda]", "always", ("ort:cpu", "ort:cuda", "reference:cpu")),
])
def test_the_targets_an_fp16_artifact_is_validated_on(tmp_path: Path, targets: str, mode: str,
                                                      expected: tuple[str, ...]) -> None:
    recipe = load_recipe_file(_recipe(tmp_path, targets, mode))
    assert recipe.validated_targets(true_fp16=True) == expected
    assert recipe.validated_targets() == tuple(recipe.targets)


@pytest.mark.slow
def test_the_fp16_budget_is_confirmed_on_the_true_float16_check_and_int8_is_not(tmp_path: Path) -> None:
    out = tmp_path / "out"
    run_recipe(load_recipe_file(_recipe(tmp_path, "[ort:cpu]")), RunOptions(out_dir=out, cache_dir=tmp_path / "cache"))
    fp16 = _findings(out, "fp16", "fp16")["budget"]
    assert set(fp16["targets"]) == {"ort:cpu", "reference:cpu"}
    assert fp16["targets"]["reference:cpu"]["status"] in ("confirmed", "missed")
    assert fp16["runtimes"]["reference:cpu"]["evaluations"] >= 1
    assert set(_findings(out, "int8", "quantize")["budget"]["targets"]) == {"ort:cpu"}


def _findings(out: Path, variant: str, stage: str) -> dict:
    sidecar = json.loads((out / "artifacts" / f"{variant}.json").read_text())
    return next(step["findings"] for step in sidecar["lineage"] if step["stage"] == stage)
