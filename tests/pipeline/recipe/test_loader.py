"""Recipe loading: valid recipes parse; every mistake is a RecipeError naming file, line and field."""

from __future__ import annotations

from pathlib import Path

import pytest

from qdeploy.core.errors import RecipeError
from qdeploy.pipeline.recipe.loader import load_recipe_file
from tests.helpers.models import DEMO_RECIPE, write_recipe

BASE = """\
name: t
model:
  onnx: tiny.onnx
data:
  calib: {reader: random, samples: 4}
variants:
  fp32: [simplify]
  int8: [simplify, {quantize: {mode: ptq, calibration: {data: calib}}}]
targets: [ort:cpu, openvino:cpu]
"""


def _load(tmp_path: Path, text: str) -> object:
    return load_recipe_file(write_recipe(tmp_path, text))


def test_demo_recipe_loads_with_defaults_filled() -> None:
    recipe = load_recipe_file(DEMO_RECIPE)
    assert recipe.name == "demo-cnn"
    assert list(recipe.variants) == ["fp32", "fp16", "int8@ort", "int8@openvino"]  # per_runtime auto splits int8
    fp16_step = recipe.variants["fp16"][1]
    assert fp16_step.stage == "fp16" and fp16_step.config.keep_io_types is True
    assert fp16_step.config.max_finite_val == 65504.0  # the stage's default is filled in, not left implicit
    assert recipe.reference_variant == "fp32"
    assert recipe.resolve(recipe.model.onnx).is_file()


@pytest.mark.parametrize(("targets", "runtime"), [("[openvino:cpu]", "openvino"), ("[ort:cpu]", None)])
def test_a_quantize_step_for_one_runtime_is_shaped_for_it_under_its_own_name(tmp_path: Path, tiny_model_path: Path,
                                                                            targets: str,
                                                                            runtime: str | None) -> None:
    """OpenVINO targets only: the one int8 graph takes OpenVINO's placement (it took ONNX Runtime's: a CRNN ran
    8% slower than NNCF's graph); ONNX Runtime's placement is what an ort-only recipe gets, as before."""
    recipe = _load(tmp_path, BASE.replace("targets: [ort:cpu, openvino:cpu]", f"targets: {targets}"))
    assert list(recipe.variants) == ["fp32", "int8"]
    step = recipe.variants["int8"][1].config
    assert step.runtime == runtime
    if runtime:
        assert step.verify_targets == ["openvino:cpu"] and step.per_runtime is False


def test_stage_by_name_and_empty_variant(tmp_path: Path, tiny_model_path: Path) -> None:
    recipe = _load(tmp_path, BASE.replace("  fp32: [simplify]\n", "  fp32: [simplify]\n  raw: []\n"))
    assert recipe.variants["raw"] == []
    assert recipe.reference_variant == "exported"


@pytest.mark.parametrize(
    ("text", "line", "needle"),
    [
        (BASE.replace("variants:", "variantz:"), 6, "unknown field 'variantz'"),
        (BASE.replace("[simplify]", "[simplfy]"), 7, "unknown stage 'simplfy'"),
        (BASE.replace("openvino:cpu", "tensorflow:cpu"), 9, "unknown target 'tensorflow:cpu'"),
        (BASE.replace("mode: ptq", "mode: ptq, bogus: 1"), 8, "unknown field 'bogus' of stage 'quantize'"),
        (BASE.replace("samples: 4", "samples: many"), 5, "samples"),
        (BASE.replace("data: calib", "data: nowhere"), None, "dataset 'nowhere'"),
        (BASE + "gates:\n  - {variant: int4, target: 'ort:cpu', metric: cosine, min: 0.9}\n", None, "variant 'int4'"),
        (BASE + "gates:\n  - {variant: fp32, target: 'ort:cuda', metric: cosine, min: 0.9}\n", None, "ort:cuda"),
        (BASE + "validate: {reference: fp64}\n", None, "fp64"),
        (BASE + "variants:\n  x: []\n", 10, "key 'variants' repeats"),
        (BASE.replace("  fp32: [simplify]\n", "  fp32: [simplify]\n  fp32: []\n"), 8, "key 'fp32' repeats"),
        (BASE.replace("tiny.onnx", "missing.onnx"), 3, "does not exist"),
        ("name: t\nmodel: [unclosed\n", 3, "YAML syntax error"),
        # keys holding '[' are the user's, not pydantic's validator tags (an IndexError, then the wrong field)
        (BASE + "'x[1]': 3\n", 10, "unknown field 'x[1]'"),
        (BASE.replace("  onnx: tiny.onnx\n", "  onnx: tiny.onnx\n  'in[': 2\n"), 4, "unknown field 'in['"),
    ],
)
def test_bad_recipes_name_line_and_problem(tmp_path: Path, tiny_model_path: Path, text: str, line: int | None,
                                           needle: str) -> None:
    with pytest.raises(RecipeError) as caught:
        _load(tmp_path, text)
    message = str(caught.value)
    assert needle in message
    assert "recipe.yaml" in message
    if line is not None:
        assert caught.value.line == line, message


def test_missing_recipe_file(tmp_path: Path) -> None:
    with pytest.raises(RecipeError, match="recipe file not found"):
        load_recipe_file(tmp_path / "nope.yaml")


def test_reserved_variant_name(tmp_path: Path, tiny_model_path: Path) -> None:
    with pytest.raises(RecipeError, match="reserved"):
        _load(tmp_path, BASE.replace("  fp32: [simplify]\n", "  fp32: [simplify]\n  exported: []\n"))


def test_bare_off_is_the_word_the_docs_write_and_booleans_still_read(tmp_path: Path, tiny_model_path: Path) -> None:
    """YAML 1.1 reads bare off/on/yes/no as booleans; the recipe loader reads YAML 1.2's (true/false) only, as
    editors' schemas do, so `report: {layers: off}` (docs/explain.md) is the word 'off'."""
    text = BASE.replace("[simplify]", "[simplify, {fp16: {fidelity_check: off, keep_io_types: yes}}]") + (
        "benchmark: {enabled: no}\nreport: {layers: off, packages: {enabled: off}}\n")
    recipe = _load(tmp_path, text)
    assert recipe.report.layers == "off" and recipe.report.packages.enabled is False
    assert recipe.benchmark.enabled is False
    step = recipe.variants["fp32"][1].config
    assert step.fidelity_check == "off" and step.keep_io_types is True


@pytest.mark.parametrize(("tolerance", "field", "needle"), [
    ("{metric: 'm.py:acc', max_drop: -0.1}", "tolerance.max_drop", "greater than or equal to 0"),
    ("{metric: 'm.py:acc', max_drop: .nan}", "tolerance.max_drop", "finite number"),
    ("{metric: 'm.py:acc', max_drop: 0.1, max_relative_drop: 0.1}", "tolerance",
     "exactly one of max_drop or max_relative_drop"),
    ("{metric: m.py, max_drop: 0.1}", "tolerance", "metric 'm.py' must be 'file.py:function'"),
    ("{max_drop: 0.1, cosine_min: 0.99}", "tolerance", "either output limits"),
    ("{cosine_mn: 0.99}", "tolerance.cosine_mn", "unknown field 'cosine_mn'"),
    ("fast", "tolerance", "valid dictionary"),
])
def test_a_task_tolerance_names_its_own_cause_not_the_other_shapes(tmp_path: Path, tiny_model_path: Path,
                                                                   tolerance: str, field: str, needle: str) -> None:
    """The two shapes of a tolerance (output limits, a task-metric budget) are told apart by their keys, so the
    complaint is the one of the shape the user wrote (it was "unknown field 'metric'" for every mistake)."""
    text = BASE.replace("calibration: {data: calib}}", f"calibration: {{data: calib}}, tolerance: {tolerance}}}")
    with pytest.raises(RecipeError) as caught:
        _load(tmp_path, text)
    assert caught.value.field == f"variants.int8.1.quantize.{field}", str(caught.value)
    assert needle in str(caught.value) and caught.value.line == 8, str(caught.value)
