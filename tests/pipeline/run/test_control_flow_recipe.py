"""The whole recipe on models with If/Loop/Scan: simplify, fp16, int8 on both CPU runtimes, loadable and matching."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest

from qdeploy.graph.order import scope_problems
from qdeploy.pipeline.recipe.loader import load_recipe_file
from qdeploy.pipeline.run.runner import RunOptions, run_recipe
from tests.control_flow_models import (
    FEATURES,
    loop_with_outer_reads_model,
    lstm_branch_model,
    nested_constant_if_model,
    scripted_torch_model,
)
from tests.helpers.models import write_recipe

RECIPE = """
    name: control-flow
    model:
      onnx: model.onnx
    data:
      val: {{reader: npy, path: val}}
    variants:
      fp32: [simplify]
      fp16: [simplify, {{fp16: {{calibration: {{data: val}}}}}}]
      int8: [simplify, {{quantize: {{mode: ptq, calibration: {{data: val}}, per_runtime: false}}}}]
    targets: [ort:cpu, openvino:cpu]
    validate: {{data: val, samples: 4{tolerance}}}
    benchmark: {{batch_sizes: [1], warmup: 1, iterations: 2, rounds: 1}}
    """


def _samples(folder: Path, make: object, count: int = 4) -> None:
    folder.mkdir()
    for index in range(count):
        np.savez(folder / f"s{index}.npz", **make(np.random.default_rng(index), index))  # type: ignore[operator]


def _run(tmp_path: Path, model: onnx.ModelProto | Path, make: object, tolerance: str = "") -> dict:
    if isinstance(model, onnx.ModelProto):
        onnx.save(model, tmp_path / "model.onnx")
    _samples(tmp_path / "val", make)
    recipe = write_recipe(tmp_path, RECIPE.format(tolerance=tolerance))
    run_recipe(load_recipe_file(recipe), RunOptions(out_dir=tmp_path / "out", show_progress=False))
    return json.loads((tmp_path / "out" / "report.json").read_text())


def _assert_all_published_and_valid(report: dict, must_pass: set[str]) -> None:
    assert report["failures"] == []
    assert {artifact["name"] for artifact in report["artifacts"]} == {"fp32", "fp16", "int8"}
    for artifact in report["artifacts"]:
        model = onnx.load(artifact["path"])
        onnx.checker.check_model(model, full_check=True)
        assert scope_problems(model.graph) == []
    rows = {(row["variant"], row["target"]): row for row in report["validation"]}
    for (variant, _target), row in rows.items():
        assert row["status"] != "error", json.dumps(row)  # every artifact runs on both runtimes
        if variant in must_pass:
            assert row["status"] == "passed", json.dumps(row)


def _vad_sample(rng: np.random.Generator, index: int) -> dict[str, np.ndarray]:
    return {"x": rng.standard_normal((1, 24, FEATURES)).astype(np.float32),
            "sr": np.array(16000 if index % 2 == 0 else 8000, np.int64)}  # both branches


@pytest.mark.slow
def test_lstm_inside_if_branches_through_the_whole_recipe(tmp_path: Path) -> None:
    report = _run(tmp_path, lstm_branch_model(), _vad_sample)
    _assert_all_published_and_valid(report, {"fp32", "fp16"})


@pytest.mark.slow
def test_nested_ifs_and_loops_from_onnx_helper_through_the_whole_recipe(tmp_path: Path) -> None:
    nested = _run(tmp_path / "nested", _mkdir_model(tmp_path / "nested", nested_constant_if_model()),
                  lambda rng, i: {"x": rng.standard_normal(3).astype(np.float32), "c1": np.array(i % 2 == 0),
                                  "c2": np.array(i // 2 == 0)})
    _assert_all_published_and_valid(nested, {"fp32", "fp16"})
    loop = _run(tmp_path / "loop", _mkdir_model(tmp_path / "loop", loop_with_outer_reads_model()),
                lambda rng, i: {"x": rng.standard_normal(4).astype(np.float32)})
    _assert_all_published_and_valid(loop, {"fp32", "fp16"})


@pytest.mark.slow
@pytest.mark.torch
def test_torch_scripted_branch_and_loop_through_the_whole_recipe(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    scripted_torch_model(tmp_path / "model.onnx")
    report = _run(tmp_path, tmp_path / "model.onnx",
                  lambda rng, i: {"x": rng.standard_normal((1, 32, FEATURES)).astype(np.float32),
                                  "sr": np.array(16000 if i % 2 == 0 else 8000, np.int64)},
                  )
    _assert_all_published_and_valid(report, {"fp32", "fp16"})


def _mkdir_model(folder: Path, model: onnx.ModelProto) -> onnx.ModelProto:
    folder.mkdir()
    return model
