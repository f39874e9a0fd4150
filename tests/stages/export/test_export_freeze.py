"""Freezing an input (``model.inputs[].value``): the input becomes a constant, what it decides is folded, the If it
selects is inlined, and OpenVINO reads the exported model, which it could not before."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import openvino as ov
import pytest

from qdeploy.core.context import StageResult
from qdeploy.core.errors import ModelError
from qdeploy.pipeline.recipe.schema import Recipe
from qdeploy.stages import export
from tests.helpers.frozen import RATE, SAMPLES, write_rate_if_model

AUDIO = np.random.default_rng(3).standard_normal((2, 1, SAMPLES)).astype(np.float32)


def _export(folder: Path, inputs: list[dict[str, object]]) -> StageResult:
    recipe = Recipe(name="t", model={"onnx": str(write_rate_if_model(folder)), "inputs": inputs}, variants={"v": []})
    recipe._source = folder / "recipe.yaml"  # values resolve against the recipe's folder
    ctx = recipe.stage_context("exported", folder / "work")
    ctx.work_dir.mkdir(parents=True, exist_ok=True)
    return export.run(None, recipe.model, ctx)


def _openvino_reads(model: onnx.ModelProto, folder: Path) -> None:
    path = folder / "frozen.onnx"
    onnx.save(model, path)
    ov.Core().compile_model(ov.Core().read_model(str(path)), "CPU")


def test_openvino_cannot_read_the_model_as_exported(tmp_path: Path) -> None:
    """The premise of the tests below: without freezing, OpenVINO refuses the Conv after the If."""
    with pytest.raises(RuntimeError, match="rank has to be known"):
        _openvino_reads(_export(tmp_path, []).model, tmp_path)


@pytest.mark.parametrize("value", [RATE, float(RATE), "rate.npy"])
def test_a_frozen_input_is_a_constant_and_its_if_is_inlined(tmp_path: Path, value: object) -> None:
    np.save(tmp_path / "rate.npy", np.array(RATE, np.int32))  # int32 in the file: cast to the input's int64
    result = _export(tmp_path, [{"name": "sr", "value": value}])
    model = result.model
    assert [value.name for value in model.graph.input] == ["audio"]
    ops = [node.op_type for node in model.graph.node]
    assert "If" not in ops and "Equal" not in ops and "Unsqueeze" not in ops, ops  # the 16 kHz branch, inlined
    findings = result.findings.to_report()
    assert findings["frozen_inputs"] == {"sr": {"value": RATE, "dtype": "int64"}}
    assert findings["ifs_inlined"] == ["by_rate"]
    assert findings["nodes_folded"] == 3  # Equal, and the Cast and Mul of sr * 0; the Add reads the audio: it stays
    # those three, the If and the branch not taken (Mul, Unsqueeze) go; the inliner adds one Identity
    assert findings["nodes_removed"] == 5
    # the exported model computes what the original did at 16 kHz
    original = ort.InferenceSession(str(tmp_path / "rate_if.onnx"), providers=["CPUExecutionProvider"])
    expected = original.run(None, {"audio": AUDIO, "sr": np.array(RATE, np.int64)})
    got = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"audio": AUDIO})
    for want, have in zip(expected, got, strict=True):
        np.testing.assert_allclose(have, want, rtol=1e-6, atol=1e-6)
    _openvino_reads(model, tmp_path)


def test_qdeploy_check_reads_the_value_against_the_model(tmp_path: Path) -> None:
    path = write_rate_if_model(tmp_path)
    base = {"onnx": str(path)}
    cases = [
        ({"name": "rate", "value": 1}, r"no such input; its inputs are \['audio', 'sr'\]"),
        ({"name": "sr", "value": 16000.5}, "is int64; its value 16000.5 is not whole"),
        ({"name": "sr", "value": [16000]}, r"shape \[1\]; the model's input has shape \[\] \(rank 0\)"),
        ({"name": "audio", "value": [[[1.0, 2.0]]]}, r"shape \[1, 1, 2\]; the model's input has shape \['\?', 1, 16\]"),
        ({"name": "sr", "value": 1e30}, "outside"),
    ]
    for spec, message in cases:
        recipe = Recipe(name="t", model={**base, "inputs": [spec]}, variants={"v": []})
        with pytest.raises(ModelError, match=message):
            export.inspect_source(recipe.model, recipe.resolve)


def test_a_value_file_enters_the_export_cache_key(tmp_path: Path) -> None:
    np.save(tmp_path / "rate.npy", np.array(RATE, np.int64))
    recipe = Recipe(name="t", model={"onnx": str(write_rate_if_model(tmp_path)),
                                     "inputs": [{"name": "sr", "value": "rate.npy"}]}, variants={"v": []})
    recipe._source = tmp_path / "recipe.yaml"
    files = export.source_files(recipe.model, recipe.stage_context("exported", tmp_path))
    assert tmp_path / "rate.npy" in files
