"""The Python API: ``import qdeploy`` runs what the CLI runs, on a dict recipe and on an in-memory model."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest

import qdeploy
from qdeploy.core.errors import RecipeError
from tests.helpers.models import REPO, tiny_cnn


def recipe_dict(**model: Any) -> dict[str, Any]:
    return {"name": "api", "model": model, "data": {"calib": {"reader": "random", "samples": 2}},
            "variants": {"fp32": ["simplify"], "int8": ["simplify", {"quantize": {"calibration": {"data": "calib"}}}]},
            "targets": ["ort:cpu"], "validate": {"reference": "fp32", "samples": 2},
            "benchmark": {"enabled": False}}


def test_run_on_an_in_memory_model_writes_it_by_content_and_reuses_the_cache(tmp_path: Path) -> None:
    model = tiny_cnn()
    first = qdeploy.run(recipe_dict(), model=model, out=tmp_path / "run")
    assert first.exit_code == 0 and first.passed
    assert set(first.artifacts) == {"fp32", "int8"} and first.artifacts["int8"].precision == "int8"
    assert first.artifacts["int8"].path.is_file()
    sources = list((tmp_path / "run" / "cache" / "sources").glob("*/model.onnx"))
    assert len(sources) == 1 and onnx.load(str(sources[0])) == model  # the model itself, by content
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    assert report == first.report

    again = qdeploy.run(recipe_dict(), model=tiny_cnn(), out=tmp_path / "run")
    assert all(row["cached"] for row in again.report["artifacts"])  # same weights: same keys
    changed = qdeploy.run(recipe_dict(), model=tiny_cnn(seed=1), out=tmp_path / "run")
    assert not any(row["cached"] for row in changed.report["artifacts"] if row["name"] == "fp32")


def test_a_model_given_twice_is_refused(tmp_path: Path) -> None:
    with pytest.raises(RecipeError, match="given twice"):
        qdeploy.run(recipe_dict(onnx="m.onnx"), model=tiny_cnn(), out=tmp_path / "run")


def test_a_dict_recipe_gets_the_loaders_checks(tmp_path: Path) -> None:
    bad = recipe_dict(onnx=str(tmp_path / "missing.onnx"))
    with pytest.raises(RecipeError, match=r"missing\.onnx"):
        qdeploy.run(bad, out=tmp_path / "run")


def test_a_torch_module_is_exported_with_the_recipes_inputs(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    module = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU()).eval()
    recipe = recipe_dict(inputs=[{"name": "x", "shape": [1, 3, 8, 8], "dtype": "float32"}])
    result = qdeploy.run(recipe, model=module, out=tmp_path / "run")
    assert result.exit_code == 0
    exported = onnx.load(str(result.artifacts["fp32"].path))
    assert [value.name for value in exported.graph.input] == ["x"]
    x = np.random.default_rng(0).standard_normal((1, 3, 8, 8)).astype(np.float32)
    import onnxruntime as ort

    got = ort.InferenceSession(str(result.artifacts["fp32"].path)).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, module(torch.from_numpy(x)).detach().numpy(), atol=1e-5)


def test_open_run_and_compare_read_a_finished_run(tmp_path: Path) -> None:
    first = qdeploy.run(recipe_dict(), model=tiny_cnn(), out=tmp_path / "run")
    opened = qdeploy.open_run(tmp_path / "run")
    assert opened.artifacts == first.artifacts and opened.exit_code == first.exit_code
    comparison = qdeploy.compare(first, opened)
    assert comparison.regressions == []


def test_import_qdeploy_is_cheap_and_the_api_is_its_surface() -> None:
    code = "import sys, qdeploy; print(sorted(m for m in ('onnx', 'onnxruntime', 'qdeploy.api') if m in sys.modules))"
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    assert loaded.stdout.strip() == "[]"
    assert {"run", "load_recipe", "Recipe", "compare", "sweep", "RunResult"} <= set(dir(qdeploy))


@pytest.mark.parametrize("name", ["../escape", "/tmp/qdeploy-api-absolute", "a/b"])
def test_a_run_name_that_is_a_path_is_refused_before_anything_is_written(tmp_path: Path, name: str,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """run(dict, model=proto) wrote <name>/cache/sources/... before the name was validated: outside the folder."""
    (tmp_path / "work").mkdir()
    monkeypatch.chdir(tmp_path / "work")
    with pytest.raises(RecipeError, match="field 'name'"):
        qdeploy.run({"name": name, "variants": {"a": []}}, model=tiny_cnn())
    assert not any(tmp_path.rglob("model.onnx")) and not Path("/tmp/qdeploy-api-absolute").exists()


def test_open_run_and_sweep_raise_qdeploys_own_errors(tmp_path: Path) -> None:
    from qdeploy.core.errors import QdeployInputError

    for folder in (tmp_path / "nowhere", tmp_path):
        with pytest.raises(QdeployInputError, match=r"no report\.json there"):
            qdeploy.open_run(folder)
    (tmp_path / "report.json").write_text("{not json")
    with pytest.raises(QdeployInputError, match=r"not a readable report\.json"):
        qdeploy.open_run(tmp_path)
    (tmp_path / "report.json").write_text(json.dumps({"benchmarks": [], "validation": [], "gates": []}))
    with pytest.raises(QdeployInputError, match="not shaped as qdeploy writes it"):
        qdeploy.open_run(tmp_path)  # no 'passed', no 'artifacts': was a KeyError
    with pytest.raises(QdeployInputError, match="choose 'local' or 'ray'"):
        qdeploy.sweep([tmp_path / "r.yaml"], executor="bogus")
    with pytest.raises(QdeployInputError, match="at least 1"):
        qdeploy.sweep([tmp_path / "r.yaml"], workers=-3)


def test_sweep_takes_one_path_as_one_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """sweep("file.yaml") iterated the string's characters."""
    from qdeploy.pipeline import sweep as sweep_module

    seen: list[list[Path]] = []

    def load_sweep(paths: list[Path]) -> Any:
        seen.append(paths)
        raise RecipeError("stop here")

    monkeypatch.setattr(sweep_module, "load_sweep", load_sweep)
    with pytest.raises(RecipeError):
        qdeploy.sweep(str(tmp_path / "file.yaml"))
    assert seen == [[tmp_path / "file.yaml"]]
