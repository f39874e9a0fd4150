"""Recipes and sweep files fuzzed through the real `qdeploy check`: exit 0 or 2, never a traceback or a hang.

Each recipe is written next to a copy of the demo model and data, so edits of the demo recipe stay partly valid
and reach the checks behind the parser (paths, the model's interface, the plan).  Budget and the longer campaign:
tests/helpers/fuzz.py.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import example, given
from hypothesis import strategies as st

from qdeploy.pipeline.run.plan import recipe_json_schema
from tests.helpers.fuzz import assert_clean_exit, demo_copy, fuzz_settings, invoke
from tests.helpers.models import DEMO_RECIPE

CHECK_SECONDS = 30
"""Time limit of one `check` (it takes ~0.03 s on the demo; a hang fails the example instead of the suite)."""


def _schema_words() -> tuple[list[str], list[str]]:
    """Every field name and every enumerated string value of the recipe's JSON schema."""
    keys: set[str] = set()
    values: set[str] = set()

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            keys.update(node.get("properties") or {})
            values.update(value for value in node.get("enum") or [] if isinstance(value, str))
            for child in node.values():
                walk(child)
        elif isinstance(node, list):
            for child in node:
                walk(child)

    walk(recipe_json_schema())
    return sorted(keys), sorted(values)


SCHEMA_KEYS, SCHEMA_VALUES = _schema_words()
DEMO = yaml.safe_load(DEMO_RECIPE.read_text())
ODD_KEYS = ["[", "]", "a[0]", "[0]", "x.y", ".", "", " ", "0", "-1", "*", "**", "$ref", "__class__", "model.onnx",
            "ü", "名前", "\u202e", "\x00", "\t", "\n", "<<", "~", "true", "null", "sweep", "recipes", "matrix"]
PATHS = ["models/demo_cnn.onnx", "data/calib", "data/val", "data/calib/sample_00.npy", "models", ".", "..", "/",
         "", "missing.onnx", "recipe.yaml", "sweep.yaml", "*", "**/*.yaml", "*.yaml", "../*.yaml", "/dev/null",
         "/dev/zero", "/proc/self/status", "/proc/kmsg", "/etc/passwd", "~/x", "models/../models/demo_cnn.onnx"]
WORDS = ["ort:cpu", "openvino:cpu", "ort:cuda", "openvino:gpu", "ort:", ":cpu", "x:y:z", "fp32", "fp16", "int8",
         "calib", "val", "input", "logits", "cosine > 0.9", "1/0", "cosine " * 50, "float32", "1e309", "-0"]

keys = st.one_of(st.sampled_from(SCHEMA_KEYS), st.sampled_from(ODD_KEYS), st.text(max_size=8),
                 st.integers(-3, 3), st.none(), st.booleans())
long_texts = st.builds(lambda char, count: char * count, st.sampled_from("a/.[ü\n"), st.integers(200, 20_000))
scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(10**20), 10**20), st.floats(), st.text(max_size=20), st.dates(),
    st.binary(max_size=8), st.sampled_from(SCHEMA_VALUES), st.sampled_from(PATHS), st.sampled_from(WORDS),
    st.integers(-2, 70), long_texts)
values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(keys, inner, max_size=4)), max_leaves=25)


def _paths(node: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Every place in a loaded YAML document: the root, then each key and list position, depth first."""
    yield prefix
    children = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for key, child in children:
        yield from _paths(child, (*prefix, key))


def _edit(doc: Any, path: tuple[Any, ...], action: str, value: Any, key: Any) -> Any:
    """`doc` with one edit at `path`: replace, delete, add a key, rename the key, or nest the value one deeper."""
    if not path:
        return value if action == "replace" else [doc] if action == "nest" else doc
    parent = doc
    for step in path[:-1]:
        parent = parent[step]
    last, old = path[-1], parent[path[-1]]
    if action == "replace":
        parent[last] = value
    elif action == "delete":
        del parent[last]
    elif action == "add" and isinstance(old, dict):
        old[key] = value
    elif action == "rename" and isinstance(parent, dict):
        parent[key] = parent.pop(last)
    elif action == "nest":
        parent[last] = {key: old} if isinstance(key, str) else [old]
    return doc


@st.composite
def edited(draw: st.DrawFn, base: Any, most: int = 4) -> Any:
    """`base` with 1 to `most` random edits (the values drawn from `values`, or moved from elsewhere in it)."""
    doc = copy.deepcopy(base)
    for _ in range(draw(st.integers(1, most))):
        path = draw(st.sampled_from(list(_paths(doc))))
        places = [place for place in _paths(doc) if place]
        moved = places and draw(st.booleans())  # a part of the document itself, put where it does not belong
        value = copy.deepcopy(_at(doc, draw(st.sampled_from(places)))) if moved else draw(values)
        doc = _edit(doc, path, draw(st.sampled_from(["replace", "delete", "add", "rename", "nest"])), value,
                    draw(keys))
    return doc


def _at(doc: Any, path: tuple[Any, ...]) -> Any:
    for step in path:
        doc = doc[step]
    return doc


def _dump(doc: Any) -> str:
    return yaml.safe_dump(doc, sort_keys=False, allow_unicode=True)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = demo_copy(tmp_path_factory.mktemp("fuzz-check"))
    (folder / "ok.yaml").write_text(_dump({**DEMO, "name": "ok"}))
    return folder


def _check(folder: Path, text: str | bytes, name: str = "recipe.yaml") -> None:
    path = folder / name
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    assert_clean_exit(invoke("check", str(path), seconds=CHECK_SECONDS))


def test_the_unedited_demo_checks_valid(workdir: Path) -> None:
    """The base of the campaign is valid: edits start from a recipe that gets past every check."""
    result = invoke("check", str(workdir / "ok.yaml"), seconds=CHECK_SECONDS)
    assert result.exit_code == 0, result.output


@pytest.mark.slow  # random and spliced recipes reach check on the fast loop
@fuzz_settings(150)
@given(recipe=edited(DEMO))
def test_edited_demo_recipes_through_check(workdir: Path, recipe: Any) -> None:
    _check(workdir, _dump(recipe))


@fuzz_settings(80)
@given(recipe=st.one_of(st.dictionaries(st.one_of(st.sampled_from(list(DEMO)), keys), values, max_size=8), values))
def test_random_recipes_through_check(workdir: Path, recipe: Any) -> None:
    _check(workdir, _dump(recipe))


SYNTAX = ["&a ", "*a", "<<: *a", "!!binary ", "!!python/object:os.system ", "!!set ", "!!float ", "? ", "- ",
          "{", "}", "[", "]", ": ", ",", "\t", "%YAML 1.1\n", "---\n", "...\n", "|\n", ">-\n", "#", '"', "'",
          "\\u0000", "\\x", "2001-12-14", "0x1F", ".inf", ".nan", "~", "yes", "\n  ", "\n- ", "\ufeff", "\u2028",
          "名前", "\U0001f600", "\x85", "\r", "name: dup\n", "model: {onnx: models/demo_cnn.onnx}\n"]


@fuzz_settings(150)
@given(data=st.data())
def test_spliced_demo_text_through_check(workdir: Path, data: st.DataObject) -> None:
    """The demo's YAML text with syntax fragments, unicode or raw bytes spliced in (or cut out) at random places."""
    raw = DEMO_RECIPE.read_bytes()
    for _ in range(data.draw(st.integers(1, 4))):
        start = data.draw(st.integers(0, len(raw)))
        end = data.draw(st.integers(start, min(len(raw), start + 40)))
        piece = data.draw(st.one_of(st.sampled_from(SYNTAX).map(str.encode), st.text(max_size=6).map(str.encode),
                                    st.binary(max_size=6)))
        raw = raw[:start] + piece + raw[end:]
    _check(workdir, raw)


MATRIX_MODEL = {"name": "demo", "model": DEMO["model"], "data": DEMO["data"]}
SWEEP = {"sweep": "fz", "recipes": ["ok.yaml"], "matrix": {
    "models": [MATRIX_MODEL], "variant_sets": {"fp": {"fp32": ["simplify"]}}, "targets": ["ort:cpu"],
    "recipe": {"validate": {"reference": "fp32"}, "gates": DEMO["gates"][:1]}}}


def test_the_unedited_sweep_checks_valid(workdir: Path) -> None:
    (workdir / "sweep.yaml").write_text(_dump(SWEEP))
    result = invoke("check", str(workdir / "sweep.yaml"), seconds=CHECK_SECONDS)
    assert result.exit_code == 0, result.output


def _with_shared(sweep: dict[str, Any], **sections: Any) -> dict[str, Any]:
    """`sweep` with other sections in its matrix's shared recipe."""
    matrix = sweep["matrix"]
    return {**sweep, "matrix": {**matrix, "recipe": {**matrix["recipe"], **sections}}}


@fuzz_settings(60)
@given(sweep=edited(SWEEP, most=3))
# found by this campaign (each was "internal error", exit 1): a shared gate's variant as a list (a set member:
# TypeError), shared gates that are no list (iterated), shared data that is no mapping (spread with **)
@example(sweep=_with_shared(SWEEP, gates=[{"variant": [], "target": "ort:cpu", "metric": "cosine", "min": 0.9}]))
@example(sweep=_with_shared(SWEEP, gates=1))
@example(sweep=_with_shared(SWEEP, data=[1]))
def test_edited_sweep_files_through_check(workdir: Path, sweep: Any) -> None:
    """Sweep files reach `check` by content (a mapping with sweep keys and no `model`): the sweep's check path."""
    _check(workdir, _dump(sweep), name="sweep.yaml")
