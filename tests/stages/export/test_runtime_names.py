"""A one-layer BERT that ONNX Runtime's transformer optimizer fused (Attention, SkipLayerNormalization, Gemm from
MatMulAddFusion) could not be loaded by ONNX Runtime at all ("Attempt to replace the existing tensor"): its saved
tensor names are the ones ONNX Runtime's passes generate again.  The export stage renames them at intake
(``qdeploy.graph.names.rename_generated_tensors``) and every variant builds."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from qdeploy.pipeline.recipe.loader import load_recipe_file
from qdeploy.pipeline.run.runner import RunOptions, run_recipe
from tests.helpers.bert import ort_fused_bert
from tests.helpers.models import write_recipe

pytestmark = [pytest.mark.slow, pytest.mark.torch]


def test_a_model_onnx_runtimes_optimizer_saved_loads_again_and_builds(tmp_path: Path) -> None:
    path = ort_fused_bert(tmp_path / "model.onnx", layers=1, hidden=32, heads=2, tokens=8, vocab=100,
                          positions=32)
    try:
        ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        pytest.skip("this ONNX Runtime loads its own optimizer's names again: the failure guarded against is gone")
    except Exception as exc:  # what a user of the saved file meets
        assert "Attempt to replace the existing tensor" in str(exc)
    recipe = load_recipe_file(write_recipe(tmp_path, """
        name: fused
        model: {onnx: model.onnx, inputs: [{name: input_ids, shape: [1, 8], dtype: int64, low: 0, high: 100},
                                           {name: attention_mask, shape: [1, 8], dtype: int64, low: 1, high: 2},
                                           {name: token_type_ids, shape: [1, 8], dtype: int64, low: 0, high: 1}]}
        variants: {fp16: [fp16], int8: [{quantize: {mode: dynamic}}]}
        targets: [ort:cpu]
        validate: {samples: 2, fp16_reference: never}
        benchmark: {enabled: false}
        """))
    report = run_recipe(recipe, RunOptions(out_dir=tmp_path / "out", show_progress=False)).report
    assert report["failures"] == []
    assert {row["variant"]: row["status"] for row in report["validation"]} == dict.fromkeys(
        ("exported", "fp16", "int8"), "passed")
    int8 = str(tmp_path / "out" / "artifacts" / "int8.onnx")
    session = ort.InferenceSession(int8, providers=["CPUExecutionProvider"])
    feed = {"input_ids": np.arange(8, dtype=np.int64)[None], "attention_mask": np.ones((1, 8), np.int64),
            "token_type_ids": np.zeros((1, 8), np.int64)}
    assert session.run(None, feed)[0].shape == (1, 8, 32)
