"""The per-layer pass (issue 31): which pairs it profiles, and per pair the precision that ran, why compute ran in
float, where an fp16 overflow is born, what the build decided and why int8 is slower than expected."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import onnx
import pytest

from qdeploy.pipeline.recipe.loader import load_recipe_file
from qdeploy.pipeline.results import layers
from qdeploy.pipeline.results.layers import decisions_of, profile_pair, profiled_pairs
from qdeploy.pipeline.results.layers_summary import pair_summary
from qdeploy.pipeline.run.runner import RunOptions, run_recipe
from tests.helpers.layers import overflow_chain, unfusable_qdq_conv
from tests.helpers.reports import report_with


def _saved(folder: Path, **models: onnx.ModelProto) -> list[Path]:
    paths = []
    for name, model in models.items():
        onnx.save(model, folder / f"{name}.onnx")
        paths.append(folder / f"{name}.onnx")
    return paths


def test_a_conv_ort_cannot_fuse_runs_in_float_and_the_summary_says_why(tmp_path: Path) -> None:
    reference, candidate = _saved(tmp_path, ref=unfusable_qdq_conv()[0], q=unfusable_qdq_conv()[1])
    feeds = [{"input": np.random.default_rng(0).random((1, 3, 16, 16), dtype=np.float32)}]
    pair = profile_pair(SimpleNamespace(path=candidate, precision="int8"), "int8", "ort:cpu", "shipped", reference,
                        feeds, report_with(), full=True)
    assert pair["status"] == "ok", pair.get("reason")
    conv = next(row for row in pair["rows"] if "conv" in row["nodes"] and row["macs"])
    assert (conv["op"], conv["precision"]) == ("Conv", "f32")
    assert conv["macs"] == 8 * 16 * 16 * 27
    assert "no QuantizeLinear after it" in conv["float_reason"]
    line = next(line for line in pair["summary"]["lines"] if "ran in float" in line)
    assert line.startswith("1 Conv ran in float: unfused Q/DQ"), pair["summary"]["lines"]
    assert pair["summary"]["by_precision"]["f32"]["macs_share"] == 1.0
    assert pair["profile"]["runs"] > 0 and pair["seconds"] > 0


def test_the_layer_where_fp16_overflows_tops_the_error_list(tmp_path: Path) -> None:
    reference, candidate = _saved(tmp_path, fp32=overflow_chain(False), fp16=overflow_chain(True))
    feeds = [{"input": np.random.default_rng(seed).random((1, 64), dtype=np.float32)} for seed in range(2)]
    pair = profile_pair(SimpleNamespace(path=candidate, precision="fp16"), "fp16", "ort:cpu", "failed validation",
                        reference, feeds, report_with(), full=False)
    worst = pair["top_error"][0]
    assert "big" in worst["nodes"] and worst["nonfinite_born"], pair["top_error"]
    assert "rows" not in pair and len(pair["timeline"]["layer"]) == pair["rows_total"]


def test_decisions_come_from_the_lineage_findings() -> None:
    report = report_with(artifacts=[{"name": "v", "lineage": [
        {"stage": "quantize", "findings": {"excluded": ["head"], "budget": {"kept_float": [
            {"node": "attn", "rank": 2, "reason": "ranked 2 of 9 by the error it adds"}]}}},
        {"stage": "fp16", "findings": {"node_block_list": ["norm"], "kept_in_fp32": [
            {"node": "pow", "tensor": "p", "predicted": 1.2e6, "reason": "Pow of an activation"}]}}]}])
    decided = decisions_of(report, "v")
    assert decided["head"].startswith("kept float: excluded by the recipe")
    assert decided["attn"] == "kept float by the accuracy budget (rank 2: ranked 2 of 9 by the error it adds)"
    assert decided["norm"].startswith("blocked from fp16 by the recipe")
    assert decided["pow"] == "blocked from fp16: Pow of an activation: tensor 'p' predicted 1.2e+06, beyond " \
                             "float16's 65504"
    assert decisions_of(report, "other") == {}


def test_auto_profiles_what_ships_and_what_failed_full_profiles_every_pair() -> None:
    report = report_with(verdict={"targets": {"ort:cpu": {"status": "ship", "variant": "int8"},
                                              "openvino:cpu": {"status": "none", "variant": None}}},
                         validation=[{"variant": v, "target": t, "status": s} for v, t, s in (
                             ("fp32", "ort:cpu", "passed"), ("int8", "ort:cpu", "passed"),
                             ("fp16", "openvino:cpu", "failed"), ("int8", "ort:cuda", "unavailable"),
                             ("fp16", "reference:cpu", "passed"))])
    variants, targets = ["fp32", "fp16", "int8"], ["ort:cpu", "openvino:cpu", "ort:cuda"]
    assert profiled_pairs("auto", report, variants, targets) == [("int8", "ort:cpu", "shipped"),
                                                                 ("fp16", "openvino:cpu", "failed validation")]
    assert [(v, t) for v, t, _ in profiled_pairs("full", report, variants, targets)] == [
        ("fp32", "ort:cpu"), ("int8", "ort:cpu"), ("fp16", "openvino:cpu")]


def test_a_shipped_reference_model_that_no_variant_built_is_not_profiled() -> None:
    report = report_with(verdict={"targets": {"ort:cpu": {"status": "ship", "variant": "reference_model"}}},
                         validation=[])
    assert profiled_pairs("auto", report, ["fp32", "int8"], ["ort:cpu"]) == []


def test_auto_skips_a_model_above_its_size_bound_and_says_how_to_profile_it(
        tiny_recipe: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(layers, "AUTO_MAX_BYTES", 100)  # the tiny CNN stands for a model of gigabytes
    result = run_recipe(load_recipe_file(tiny_recipe), RunOptions(out_dir=tmp_path / "run", show_progress=False))
    pairs = result.report["layers"]["pairs"]
    assert pairs and all(pair["status"] == "skipped" for pair in pairs)
    assert "report.layers: full profiles it" in pairs[0]["reason"]


def _row(layer: str, op: str, precision: str, ms: float, macs: int | None = None,
         nodes: list[str] | None = None) -> dict:
    return {"layer": layer, "op": op, "precision": precision, "time_ms": ms, "macs": macs,
            "nodes": [layer] if nodes is None else nodes}


def test_slow_int8_names_the_layout_change_and_the_float_fallback() -> None:
    rows = [_row("conv1", "QLinearConv", "int8", 1.0, 600), _row("Transpose", "Transpose", "int8", 2.0, nodes=[]),
            _row("conv2", "Conv", "f32", 1.0, 400)]
    summary = pair_summary(rows, target="ort:cpu", artifact_precision="int8", speedup=0.8)
    assert summary["slow"]["causes"] == ["a layout change", "a float fallback"]
    assert summary["lines"][0] == "int8 kernels: 60% of MACs, 75% of time on ort:cpu"
    assert "int8 is slower than expected (0.800x" in summary["lines"][-1]
    assert pair_summary(rows, target="ort:cpu", artifact_precision="int8", speedup=2.0)["slow"] is None
