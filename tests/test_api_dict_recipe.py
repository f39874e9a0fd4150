"""A recipe given to the Python API as a dict: its errors name the field, never a made-up file and a line of YAML
the user never wrote; its relative paths resolve against ``base_dir`` (default the current folder), and the
docstrings and README say so."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import onnx
import pytest

import qdeploy
from qdeploy.core.errors import RecipeError
from tests.helpers.models import REPO, tiny_cnn


def _recipe(**model: Any) -> dict[str, Any]:
    return {"name": "d", "model": {"onnx": "m.onnx", **model}, "variants": {"fp32": []}, "targets": ["ort:cpu"]}


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    onnx.save(tiny_cnn(), tmp_path / "m.onnx")
    return tmp_path


def _error(recipe: Any, **kwargs: Any) -> RecipeError:
    with pytest.raises(RecipeError) as caught:
        qdeploy.load_recipe(recipe, **kwargs)
    return caught.value


def test_a_bad_value_names_the_field_not_a_file_and_line(folder: Path) -> None:
    recipe = {**_recipe(), "variants": {"int8": [{"quantize": {"mode": "bogus"}}]}}
    error = _error(recipe, base_dir=folder)
    assert str(error).startswith("recipe (dict): field 'variants.int8.0.quantize.mode': "), error
    assert "<dict recipe>" not in str(error) and error.line is None


def test_a_missing_path_says_what_it_resolved_against(folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(folder.parent)
    error = _error(_recipe())
    assert str(error).startswith("recipe (dict): field 'model.onnx': path 'm.onnx' does not exist"), error
    assert str(folder.parent / "m.onnx") in str(error) and "base_dir" in str(error)
    assert qdeploy.load_recipe(_recipe(), base_dir=folder).resolve("m.onnx") == folder / "m.onnx"
    monkeypatch.chdir(folder)
    assert qdeploy.load_recipe(_recipe()).base_dir == folder  # default: the current folder


def test_path_objects_are_text_and_other_objects_are_named(folder: Path) -> None:
    assert qdeploy.load_recipe(_recipe(onnx=folder / "m.onnx")).model.onnx == str(folder / "m.onnx")
    error = _error(_recipe(onnx=object()), base_dir=folder)
    assert str(error).startswith("recipe (dict): field 'model.onnx': a value of type object"), error
    assert "recipe: a recipe is a YAML file's path, a dict or a Recipe, not a list" in str(_error([1]))


def test_base_dir_is_documented() -> None:
    for function in (qdeploy.run, qdeploy.load_recipe):
        assert "base_dir" in (function.__doc__ or ""), function
    python = (REPO / "README.md").read_text().split("## Python", 1)[1].split("\n## ", 1)[0]
    assert "base_dir" in python
