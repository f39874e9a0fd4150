"""The reference at the device's default precision (``fp32@default``): validated and timed as its own row where the
device runs float32 below float32 by default, never elsewhere (pipeline/run/device_default.py).  The CPU facts are
injected ($QDEPLOY_CPU_FLAGS), so the test says the same on every CPU."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from qdeploy.pipeline.publish.package.publish import package_from_run
from qdeploy.pipeline.recipe.loader import load_recipe_file
from qdeploy.pipeline.run.runner import RunOptions, run_recipe
from qdeploy.targets.int8_path import FLAGS_ENV
from tests.helpers.models import write_recipe


def _run(tiny_recipe: Path, tmp_path: Path) -> dict:
    path = tiny_recipe.with_name("openvino.yaml")
    path.write_text(tiny_recipe.read_text().replace("targets: [ort:cpu]", "targets: [ort:cpu, openvino:cpu]"))
    result = run_recipe(load_recipe_file(path), RunOptions(out_dir=tmp_path / "out", show_progress=False))
    assert result.exit_code == 0, (result.report["failures"], result.report["unmeasured"])
    return result.report


def test_a_bf16_cpu_gets_the_fp32_row_at_its_default(tiny_recipe: Path, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(FLAGS_ENV, "avx2 avx512f avx512_vnni avx512_bf16 amx_bf16 amx_int8")
    report = _run(tiny_recipe, tmp_path)
    checks = {(row["variant"], row["target"]): row for row in report["validation"]}
    row = checks[("fp32@default", "openvino:cpu")]
    assert ("fp32@default", "ort:cpu") not in checks  # ONNX Runtime has no reduced default
    assert row["status"] == "passed" and row["precision_hint"] is None, row  # None: the device default
    assert row["tolerance_basis"].startswith("held to the ") and "runs it by default" in row["tolerance_basis"]
    assert checks[("fp32", "openvino:cpu")]["precision_hint"] == "f32"  # the reference stays pinned
    timed = {(row["variant"], row["target"]): row for row in report["benchmarks"]}
    assert timed[("fp32@default", "openvino:cpu")]["status"] == "ok"
    assert timed[("fp32@default", "openvino:cpu")]["speedup_vs_default"] == pytest.approx(1.0)
    int8 = next(row for (variant, target), row in timed.items()
                if variant.startswith("int8") and target == "openvino:cpu")
    assert int8["speedup_vs_default"] is not None and int8["speedup"] is not None
    assert timed[("fp32", "ort:cpu")]["speedup_vs_default"] is None
    assert "fp32@default" not in {artifact["name"] for artifact in report["artifacts"]}  # one file, two settings
    [folder] = package_from_run(tmp_path / "out", "openvino:cpu", ["fp32@default"], tmp_path / "packages")
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["made_by"]["artifact"]["file"] == "artifacts/fp32.onnx"  # the reference's file, shipped as is
    settings = json.loads((folder / "runtime.json").read_text())
    ran = row["execution"]["precision"]  # what validation ran at the default: the setting the package pins
    assert settings["properties"]["INFERENCE_PRECISION_HINT"] == settings["validated_with"] == ran, settings


def test_a_cpu_whose_default_is_float32_gets_no_such_row(tiny_recipe: Path, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(FLAGS_ENV, "avx2 fma")
    report = _run(tiny_recipe, tmp_path)
    assert not [row for row in report["validation"] if row["variant"] == "fp32@default"]
    assert all(row["speedup_vs_default"] is None for row in report["benchmarks"])


WEIGHT_ONLY_RECIPE = """
    name: wo
    model: {onnx: mlp.onnx}
    data:
      calib: {reader: random, samples: 4, seed: 1}
    variants:
      fp32: [simplify]
      int4: [simplify, {quantize: {mode: weight_only, bits: 4, group_size: 32}}]
      int8: [simplify, {quantize: {mode: ptq, calibration: {data: calib}, per_runtime: false}}]
    targets: [ort:cpu, openvino:cpu]
    validate: {reference: fp32, samples: 2, tolerance: {cosine_min: 0.9}}
    benchmark: {batch_sizes: [1], warmup: 1, iterations: 3, rounds: 1, busy_seconds: 0}
    """


def _mlp(path: Path) -> None:
    import numpy as np
    import onnx
    from onnx import helper

    from tests.helpers.quantize import init, make_model

    rng = np.random.default_rng(5)
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"], name="mm1"),
             helper.make_node("Relu", ["h"], ["r"], name="relu"),
             helper.make_node("MatMul", ["r", "w2"], ["y"], name="mm2")]
    onnx.save(make_model(nodes, [init("w1", rng.standard_normal((64, 64)) * 0.2),
                                 init("w2", rng.standard_normal((64, 16)) * 0.2)], {"x": [1, 64]}, {"y": [1, 16]}),
              str(path))


def _weight_only_run(tmp_path: Path, recipe: str = WEIGHT_ONLY_RECIPE) -> dict:
    tmp_path.mkdir(exist_ok=True)
    _mlp(tmp_path / "mlp.onnx")
    result = run_recipe(load_recipe_file(write_recipe(tmp_path, recipe)),
                        RunOptions(out_dir=tmp_path / "out", show_progress=False))
    assert result.exit_code == 0, (result.report["failures"], result.report["unmeasured"])
    return result.report


def test_a_weight_only_artifact_gets_an_f32_row_where_the_default_is_bf16(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(FLAGS_ENV, "avx2 avx512f avx512_vnni avx512_bf16 amx_bf16 amx_int8")
    report = _weight_only_run(tmp_path)
    checks = {(row["variant"], row["target"]): row for row in report["validation"]}
    pinned = checks[("int4@f32", "openvino:cpu")]
    assert ("int4@f32", "ort:cpu") not in checks  # ONNX Runtime's CPU provider has one precision
    assert ("int8@f32", "openvino:cpu") not in checks  # int8 activations: not weight-only
    assert pinned["status"] == "passed" and pinned["precision_hint"] == "f32" and pinned["deploy_precision"] == "f32"
    assert pinned["execution"]["precision"] == "f32", pinned["execution"]
    assert checks[("int4", "openvino:cpu")]["precision_hint"] != "f32"  # the default row stays at the default
    timed = {(row["variant"], row["target"]): row for row in report["benchmarks"]}
    row = timed[("int4@f32", "openvino:cpu")]
    assert row["status"] == "ok" and row["precision_hint"] == "f32" and row["execution"]["precision"] == "f32"
    assert any("float32, as the weight-only file declares them" in note for note in row["notes"]), row["notes"]
    assert "int4@f32" not in {artifact["name"] for artifact in report["artifacts"]}  # one file, two settings
    [folder] = package_from_run(tmp_path / "out", "openvino:cpu", ["int4@f32"], tmp_path / "packages")
    assert json.loads((folder / "manifest.json").read_text())["made_by"]["artifact"]["file"] == "artifacts/int4.onnx"
    settings = json.loads((folder / "runtime.json").read_text())
    assert settings["properties"]["INFERENCE_PRECISION_HINT"] == "f32", settings
    assert "int4@f32" in settings["precision_pinned"]["why"], settings


def test_no_f32_row_where_the_default_is_float32_or_the_benchmark_says_no(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(FLAGS_ENV, "avx2 fma")
    report = _weight_only_run(tmp_path / "avx2")
    assert not [row for row in report["validation"] if row["variant"].endswith("@f32")]
    monkeypatch.setenv(FLAGS_ENV, "avx2 avx512f avx512_vnni avx512_bf16 amx_bf16 amx_int8")
    report = _weight_only_run(tmp_path / "off", WEIGHT_ONLY_RECIPE.replace(
        "busy_seconds: 0}", "busy_seconds: 0, weight_only_f32: false}"))
    assert not [row for row in report["validation"] if row["variant"].endswith("@f32")]
    assert [row for row in report["validation"] if row["variant"] == "fp32@default"]
