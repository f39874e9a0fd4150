"""A GPT-style decoder (transformers, from a config; past key/values as exporters write them) through the whole
recipe: fp32, fp16, int8 dynamic and int4/int8 weight-only, on both CPU runtimes, fed token ids from the recipe's
data (never random values outside the vocabulary)."""

from __future__ import annotations

import json
from pathlib import Path

import onnx
import pytest

from qdeploy.pipeline.recipe.loader import load_recipe_file
from qdeploy.pipeline.run.runner import RunOptions, run_recipe
from tests.helpers.decoder import export, write_prompts
from tests.helpers.models import write_recipe

LAYERS = 2
RECIPE = """
    name: decoder
    model: {onnx: decoder.onnx}
    data:
      prompts: {reader: npy, path: prompts}
    variants:
      fp32: [simplify]
      fp16: [simplify, fp16]
      int8: [simplify, {quantize: {mode: dynamic}}]
      int4: [simplify, {quantize: {mode: weight_only, bits: 4, group_size: 32}}]
      int8wo: [simplify, {quantize: {mode: weight_only, bits: 8, group_size: 32, weight_format: dequantize_linear}}]
    targets: [ort:cpu, openvino:cpu]
    validate: {data: prompts, samples: 3, tolerance: {cosine_min: 0.98}}
    benchmark: {iterations: 2, warmup: 1, rounds: 1}
    report: {formats: [json]}
    """


# slow: the weight-only builders run on the fast loop in tests/stages/quantize/weight_only/test_quantize_weight_only.py
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, Path]:
    folder = tmp_path_factory.mktemp("decoder")
    _, config = export(folder / "decoder.onnx", layers=LAYERS, hidden=64, vocab=1000)
    write_prompts(folder / "prompts", config, 3, prompt=8)
    result = run_recipe(load_recipe_file(write_recipe(folder, RECIPE)),
                        RunOptions(out_dir=folder / "run", show_progress=False))
    assert result.exit_code == 0, (result.report.get("failures"), result.report.get("gates"))
    return result.report, folder / "run"


def _nodes(out: Path, variant: str) -> dict[str, list[onnx.NodeProto]]:
    model = onnx.load(str(out / "artifacts" / f"{variant}.onnx"), load_external_data=False)
    found: dict[str, list[onnx.NodeProto]] = {}
    for node in model.graph.node:
        found.setdefault(node.op_type, []).append(node)
    return found


def _attrs(node: onnx.NodeProto) -> dict[str, int]:
    return {attr.name: attr.i for attr in node.attribute}


def test_every_variant_validates_and_benchmarks_on_both_runtimes(run: tuple[dict, Path]) -> None:
    report, _ = run
    validation = {(row["variant"], row["target"]): row for row in report["validation"]}
    for variant in ("fp32", "fp16", "int8", "int4", "int8wo"):
        for target in ("ort:cpu", "openvino:cpu"):
            row = validation[(variant, target)]
            assert row["status"] == "passed", (variant, target, row.get("reason"))
            bench = next(b for b in report["benchmarks"] if b["variant"] == variant and b["target"] == target)
            assert bench["status"] == "ok", (variant, target, bench.get("reason"))


def test_int4_artifact_holds_matmulnbits_with_the_recipe_settings(run: tuple[dict, Path]) -> None:
    report, out = run
    nodes = _nodes(out, "int4")
    assert "MatMul" not in nodes or all(  # what stays MatMul multiplies two activations (attention)
        not any(name.endswith(("_q4", "_q8")) for name in node.input) for node in nodes["MatMul"])
    bits = sorted(_attrs(node)["bits"] for node in nodes["MatMulNBits"])
    assert bits == [4] * (7 * LAYERS) + [8]  # q, k, v, o, gate, up, down per layer; the LM head on int8
    assert all(_attrs(node)["block_size"] == 32 and _attrs(node)["accuracy_level"] == 4
               for node in nodes["MatMulNBits"])
    assert [_attrs(node)["bits"] for node in nodes["GatherBlockQuantized"]] == [4]  # the embedding
    sizes = {row["name"]: row["size_bytes"] for row in report["artifacts"]}
    assert sizes["int4"] < sizes["fp32"] / 3
    findings = next(step["findings"] for step in _lineage(out, "int4") if step["stage"] == "quantize")
    assert findings["quantized_weights"] == {"MatMul int4": 7 * LAYERS, "MatMul int8": 1, "Gather int4": 1}


def test_int8_weight_only_in_the_standard_form_uses_blocked_dequantize_linear(run: tuple[dict, Path]) -> None:
    _, out = run
    nodes = _nodes(out, "int8wo")
    assert "MatMulNBits" not in nodes and len(nodes["DequantizeLinear"]) == 7 * LAYERS + 2
    assert all(_attrs(node)["block_size"] == 32 for node in nodes["DequantizeLinear"])
    model = onnx.load(str(out / "artifacts" / "int8wo.onnx"), load_external_data=False)
    assert next(entry.version for entry in model.opset_import if entry.domain in ("", "ai.onnx")) >= 21


def _lineage(out: Path, variant: str) -> list[dict]:
    return json.loads((out / "artifacts" / f"{variant}.json").read_text())["lineage"]
