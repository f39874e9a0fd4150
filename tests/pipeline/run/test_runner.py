"""The runner: cache reuse and invalidation, failure isolation, the report contract, gates and exit codes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import onnx
import pytest

from qdeploy.pipeline.recipe.loader import load_recipe_file
from qdeploy.pipeline.run.runner import RunOptions, run_recipe
from tests.helpers.models import write_recipe

ARTIFACT_KEYS = {"name", "path", "sha256", "size_bytes", "parent", "stages", "cached", "seconds"}
VALIDATION_KEYS = {"variant", "target", "status", "reason", "metrics", "effective_precision"}
BENCHMARK_KEYS = {"variant", "target", "batch_size", "status", "reason", "latency_ms", "throughput_per_s", "runs",
                  "session_create_ms"}
LATENCY_KEYS = {"p50", "p90", "p99", "mean", "std", "min", "max"}


def _run(recipe_path: Path, out: Path, **options: object) -> tuple[dict, int]:
    result = run_recipe(load_recipe_file(recipe_path), RunOptions(out_dir=out, show_progress=False, **options))
    return json.loads((out / "report.json").read_text()), result.exit_code


def _lineage_cached(report: dict, variant: str) -> dict[str, bool]:
    artifact = next(a for a in report["artifacts"] if a["name"] == variant)
    return {step["stage"]: step["cached"] for step in artifact["lineage"]}


def test_report_contract_and_second_run_reuses_every_transform(tiny_recipe: Path, tmp_path: Path) -> None:
    report, code = _run(tiny_recipe, tmp_path / "out")
    assert code == 0, report["failures"]
    env = report["environment"]
    for library in ("onnx", "onnxruntime", "openvino", "onnxconverter-common", "onnxoptimizer", "qdeploy"):
        assert library in env["versions"]
    assert {"avx512f", "avx512_vnni", "avx512_bf16", "f16c"} <= set(env["cpu"]["flags"])
    assert "ort:cpu" in env["available_targets"]
    assert {a["name"] for a in report["artifacts"]} == {"fp32", "fp16", "int8"}
    for artifact in report["artifacts"]:
        assert set(artifact) >= ARTIFACT_KEYS
        assert artifact["cached"] is False
        assert Path(artifact["path"]).is_file() and Path(artifact["path"]).name == f"{artifact['name']}.onnx"
        sidecar = json.loads(Path(artifact["path"]).with_suffix(".json").read_text())
        assert sidecar["sha256"] == artifact["sha256"] and sidecar["variant"] == artifact["name"]
        onnx.checker.check_model(onnx.load(artifact["path"]))
    for row in report["validation"]:
        assert set(row) >= VALIDATION_KEYS
        assert row["status"] == "passed", row
        assert {"max_abs_err", "mean_abs_err", "cosine", "snr_db", "top1_agreement"} <= set(row["metrics"])
    for row in report["benchmarks"]:
        assert set(row) >= BENCHMARK_KEYS and row["status"] == "ok"
        assert set(row["latency_ms"]) >= LATENCY_KEYS and row["runs"] == 5
        assert row["latency_ms"]["min"] <= row["latency_ms"]["p50"] <= row["latency_ms"]["max"]

    again, code = _run(tiny_recipe, tmp_path / "out")
    assert code == 0
    assert all(a["cached"] for a in again["artifacts"])
    assert [a["sha256"] for a in again["artifacts"]] == [a["sha256"] for a in report["artifacts"]]


def test_changed_config_reruns_that_stage_and_descendants_only(tiny_recipe: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    _run(tiny_recipe, out)
    text = tiny_recipe.read_text().replace("keep_io_types: true", "keep_io_types: false")
    tiny_recipe.write_text(text)
    report, code = _run(tiny_recipe, out)
    assert code == 0, report["failures"]
    assert _lineage_cached(report, "fp16") == {"export": True, "simplify": True, "fp16": False}
    assert _lineage_cached(report, "int8") == {"export": True, "simplify": True, "quantize": True}
    assert _lineage_cached(report, "fp32") == {"export": True, "simplify": True}


def test_no_cache_rebuilds(tiny_recipe: Path, tmp_path: Path) -> None:
    _run(tiny_recipe, tmp_path / "out")
    report, _ = _run(tiny_recipe, tmp_path / "out", use_cache=False)
    assert not any(a["cached"] for a in report["artifacts"])


def test_failing_variant_keeps_the_others_and_exits_1(tmp_path: Path, tiny_model_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    # a stage that fails at run time: that variant fails, the others are measured and reported
    import qdeploy.stages.quantize
    from qdeploy.core.errors import StageError

    def failing(_artifact: object, _config: object, ctx: Any) -> None:
        raise StageError("quantize", ctx.variant, "the model is already quantized (forced for this test)")

    monkeypatch.setattr(qdeploy.stages.quantize, "run", failing)
    recipe = write_recipe(tmp_path, """
        name: t
        model: {onnx: tiny.onnx}
        variants:
          fp32: [simplify]
          twice: [quantize]
        targets: [ort:cpu]
        validate: {reference: fp32, samples: 2}
        benchmark: {enabled: false}
        """)
    report, code = _run(recipe, tmp_path / "out")
    assert code == 1
    assert [f["variant"] for f in report["failures"]] == ["twice"]
    assert "already quantized" in report["failures"][0]["reason"]
    assert [a["name"] for a in report["artifacts"]] == ["fp32"]
    assert {(r["variant"], r["status"]) for r in report["validation"]} == {("fp32", "passed")}
    assert (tmp_path / "out" / "report.md").read_text().count("twice") >= 1


def test_gates_decide_the_exit_code(tmp_path: Path, tiny_model_path: Path) -> None:
    body = """
        name: t
        model: {onnx: tiny.onnx}
        variants:
          fp32: [simplify]
          fp16: [simplify, fp16]
        targets: [ort:cpu, ort:cuda]
        validate: {reference: fp32, samples: 2}
        benchmark: {iterations: 3, warmup: 0, rounds: 1}
        gates:
          - {variant: fp16, target: "ort:cpu", metric: cosine, min: MIN}
          - {variant: fp16, target: "ort:cpu", metric: size_bytes, max: 1000000}
        """
    report, code = _run(write_recipe(tmp_path, body.replace("MIN", "0.99")), tmp_path / "a")
    assert code == 0 and all(g["passed"] for g in report["gates"])
    assert 0.99 <= report["gates"][0]["value"] <= 1.0
    cuda = [r for r in report["validation"] + report["benchmarks"] if r["target"] == "ort:cuda"]
    assert cuda and all(r["status"] == "unavailable" and "CUDAExecutionProvider" not in r["reason"].split(
        "has")[-1] for r in cuda)
    report, code = _run(write_recipe(tmp_path, body.replace("MIN", "1.01")), tmp_path / "b")
    assert code == 1
    assert [g["passed"] for g in report["gates"]] == [False, True]
    assert "FAIL" in (tmp_path / "b" / "report.md").read_text()


def test_unknown_variant_option_is_input_error(tiny_recipe: Path, tmp_path: Path) -> None:
    from qdeploy.core.errors import QdeployInputError

    with pytest.raises(QdeployInputError, match="int4"):
        _run(tiny_recipe, tmp_path / "out", variants=["int4"])


def test_a_selection_without_the_reference_builds_it_and_says_so(tmp_path: Path, tiny_model_path: Path,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    """`run --variant int8@ort` (a per_runtime build) without fp32: the reference is built too, so int8@ort is
    validated against it (it ended in "reference variant 'fp32' was not built", exit 1)."""
    recipe = write_recipe(tmp_path, """
        name: picked
        model: {onnx: tiny.onnx}
        data:
          calib: {reader: random, samples: 4}
        variants:
          fp32: [simplify]
          int8: [simplify, {quantize: {calibration: {data: calib}, per_runtime: true}}]
        targets: [ort:cpu]
        validate: {reference: fp32, samples: 2}
        benchmark: {enabled: false}
        report: {layers: "off", packages: {enabled: false}}
        """)
    with caplog.at_level("WARNING", logger="qdeploy.pipeline"):
        report, code = _run(recipe, tmp_path / "out", variants=["int8@ort"])
    assert code == 0, [(row["variant"], row["reason"]) for row in report["validation"]]
    assert [artifact["name"] for artifact in report["artifacts"]] == ["fp32", "int8@ort"]
    assert {row["variant"]: row["status"] for row in report["validation"]} == {"fp32": "passed", "int8@ort": "passed"}
    assert "leaves out the reference variant 'fp32': building it too" in caplog.text
