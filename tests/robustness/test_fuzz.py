"""Fuzzing in the suite: random recipes and mutated models; every failure is a clean typed error, never a crash
or a hang.

This file fuzzes the recipe parser and the model loader directly, and checks the per-example time guard.
test_fuzz_cli.py sends recipes and sweep files through `qdeploy check`; test_fuzz_models.py sends mutated demo
models through `check` and `run`.  The profile, the budget and the longer campaign (QDEPLOY_FUZZ_EXAMPLES):
tests/helpers/fuzz.py.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from qdeploy.core.errors import ModelError, RecipeError
from qdeploy.pipeline.recipe.loader import parse_recipe
from qdeploy.stages.export import ExportConfig, _prepare
from qdeploy.stages.export._model import load_onnx
from tests.helpers.fuzz import ExampleHung, fuzz_settings, time_limit
from tests.helpers.models import DEMO_RECIPE, tiny_cnn


def test_the_time_guard_stops_a_hang_that_swallows_exceptions() -> None:
    """A hung example fails in its time, even inside code that catches every Exception (as the CLI does)."""
    started = time.monotonic()
    with pytest.raises(ExampleHung), time_limit(0.2), contextlib.suppress(Exception):
        time.sleep(30)
    assert time.monotonic() - started < 5


FUZZ = fuzz_settings(150, seconds=5)
scalars = st.one_of(st.none(), st.booleans(), st.integers(-5, 10**6), st.floats(allow_nan=True),
                    st.text(max_size=12), st.sampled_from(["ort:cpu", "simplify", "fp16", "quantize", "npy",
                                                           "random", "fp32", "calib", "models/demo_cnn.onnx"]))
values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.sampled_from(
        ["name", "model", "onnx", "variants", "targets", "data", "validate", "benchmark", "gates", "reader",
         "path", "fp16", "quantize", "simplify", "tolerance", "variant", "metric", "min", "inputs", "shape"]),
        inner, max_size=5)), max_leaves=20)
DEMO = yaml.safe_load(DEMO_RECIPE.read_text())


def _parse(text: str) -> None:
    try:
        with time_limit(10):
            parse_recipe(text, source=DEMO_RECIPE)
    except RecipeError as exc:
        assert str(exc).startswith(str(DEMO_RECIPE))


@FUZZ
@given(st.dictionaries(st.sampled_from([*list(DEMO), "extra"]), values, max_size=8))
def test_random_recipes_fail_cleanly(recipe: dict) -> None:
    _parse(yaml.safe_dump(recipe))


@FUZZ
@given(st.sampled_from(list(DEMO)), values)
def test_one_section_of_the_demo_replaced_by_junk(section: str, junk: object) -> None:
    _parse(yaml.safe_dump({**DEMO, section: junk}))


@FUZZ
@given(st.text(max_size=300))
def test_random_text_fails_cleanly(text: str) -> None:
    _parse(text)


@pytest.fixture(scope="module")
def model_bytes() -> bytes:
    return tiny_cnn().SerializeToString()


@FUZZ
@given(data=st.data())
def test_byte_mutated_models_fail_cleanly(tmp_path: Path, model_bytes: bytes, data: st.DataObject) -> None:
    mutated = bytearray(model_bytes)
    for _ in range(data.draw(st.integers(1, 8))):
        position = data.draw(st.integers(0, len(mutated) - 1))
        mutated[position] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(len(mutated) // 2, len(mutated)))
    path = tmp_path / "m.onnx"
    path.write_bytes(bytes(mutated[:cut]))
    with time_limit(10):
        try:
            model = load_onnx(path)
        except ModelError as exc:
            assert "m.onnx" in str(exc)
            return
        with contextlib.suppress(ModelError):  # the export stage's checks: a clean ModelError or nothing
            _prepare(model, ExportConfig(onnx="m.onnx"), {})
