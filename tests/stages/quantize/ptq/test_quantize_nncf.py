"""quantize engine nncf: NNCF's nncf.quantize builds the int8 model from the recipe's calibration data, and
qdeploy checks, validates, benchmarks and ranks it beside its own (the verdict picks per target)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from qdeploy.core.errors import StageError
from qdeploy.pipeline.recipe.loader import load_recipe_file
from qdeploy.pipeline.run.runner import RunOptions, run_recipe
from qdeploy.stages import quantize
from qdeploy.stages.quantize import QuantizeConfig
from tests.helpers.models import write_recipe
from tests.helpers.quantize import DEMO_MODEL, DEMO_VAL, save_artifact, stage_context, tiny_conv

RECIPE = f"""
    name: engines
    model: {{onnx: {DEMO_MODEL}}}
    data:
      val: {{reader: npy, path: {DEMO_VAL}}}
      calib: {{reader: npy, path: {DEMO_VAL.parent / "calib"}}}
    variants:
      int8: [{{quantize: {{calibration: {{data: calib, samples: 8}}}}}}]
      int8-nncf: [{{quantize: {{engine: nncf, calibration: {{data: calib, samples: 8}}, exclude_nodes: [EXCLUDED]}}}}]
    targets: [ort:cpu, openvino:cpu]
    validate: {{data: val, samples: 4}}
    benchmark: {{iterations: 3, warmup: 1, rounds: 1}}
    report: {{formats: [json]}}
    """


def test_nncf_builds_a_variant_that_qdeploy_validates_benchmarks_and_ranks(tmp_path: Path) -> None:
    pytest.importorskip("nncf", reason="engine nncf is optional (pip install 'qdeploy[nncf]')")
    import onnx

    first_conv = next(node.name for node in onnx.load(str(DEMO_MODEL)).graph.node if node.op_type == "Conv")
    recipe = load_recipe_file(write_recipe(tmp_path, RECIPE.replace("EXCLUDED", first_conv)))
    result = run_recipe(recipe, RunOptions(out_dir=tmp_path / "run", show_progress=False))
    assert result.exit_code == 0, result.report.get("failures")
    rows = {(row["variant"], row["target"]): row for row in result.report["validation"]}
    for target in ("ort:cpu", "openvino:cpu"):
        assert rows[("int8-nncf", target)]["status"] == "passed", rows[("int8-nncf", target)].get("reason")
        assert any(b["variant"] == "int8-nncf" and b["target"] == target and b["status"] == "ok"
                   for b in result.report["benchmarks"])
        assert result.report["verdict"]["targets"][target]["status"] == "ship"
    sidecar = json.loads((tmp_path / "run" / "artifacts" / "int8-nncf.json").read_text())
    findings = next(step["findings"] for step in sidecar["lineage"] if step["stage"] == "quantize")
    assert findings["engine"] == "nncf" and findings["calibration_samples"] == 8
    assert findings["reduce_range"]["nncf_overflow_fix"] == "enable"  # CPU targets: 7-bit weights (no VNNI)
    assert findings["quantized_nodes"].get("Conv", 0) >= 1 and findings["int8_kernels"]
    model = onnx.load(str(tmp_path / "run" / "artifacts" / "int8-nncf.onnx"))
    producer = {out: node.op_type for node in model.graph.node for out in node.output}
    convs = {node.name: producer.get(node.input[1]) == "DequantizeLinear" for node in model.graph.node
             if node.op_type == "Conv"}
    assert convs[first_conv] is False and any(convs.values())  # exclude_nodes reached NNCF's ignored scope


def test_without_nncf_the_stage_says_how_to_install_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from qdeploy.stages.quantize.ptq import _nncf

    monkeypatch.setattr(_nncf, "_nncf", lambda: None)
    with pytest.raises(StageError, match=r"pip install 'qdeploy\[nncf\]'"):
        quantize.run(save_artifact(tmp_path, tiny_conv()), QuantizeConfig(engine="nncf"), stage_context(tmp_path))


@pytest.mark.parametrize(("settings", "words"), [
    ({"engine": "nncf", "method": "entropy"},
     "quantize.ptq with engine nncf does not take 'method' (it applies to modes ptq with engine qdeploy and "
     "weight_only)"),
    ({"engine": "nncf", "tolerance": {"cosine_min": 0.99}}, "quantize.ptq with engine nncf does not take 'tolerance'"),
    ({"engine": "nncf", "mode": "dynamic"}, "quantize.dynamic does not take 'engine' (it applies to mode ptq)"),
    ({"nncf_model_type": "transformer"},
     "quantize.ptq does not take 'nncf_model_type' (it applies to mode ptq with engine nncf)"),
])
def test_settings_nncf_does_not_take_are_refused(settings: dict, words: str) -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError) as caught:
        QuantizeConfig(**settings)
    assert words in str(caught.value)
