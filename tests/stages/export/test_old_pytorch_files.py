"""PyTorch 0.3's ONNX files (IR 3, opset 6 or 9), which the ONNX wheel ships with their inputs and expected outputs
(``onnx/backend/test/data/pytorch-converted`` and ``pytorch-operator``), taken in as a user would: exported as
they are, or with ``model.opset: 13`` where the error says ONNX Runtime dropped an op version, and then run on
their own inputs against their own outputs.

Before: every one of them failed fp16 (weights listed as inputs), 24 could not load (dropped op versions, the
error said only "re-export"), three converted PReLU models failed to run (per-channel slopes broadcast on the
last axis) and converted files failed int8 (constants listed as inputs at IR 3)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper

from qdeploy.core.errors import ModelError
from qdeploy.pipeline.recipe.schema import Recipe
from qdeploy.stages import export

DATA = Path(onnx.__file__).parent / "backend" / "test" / "data"
CASES = sorted([*DATA.glob("pytorch-converted/*/model.onnx"), *DATA.glob("pytorch-operator/*/model.onnx")])
CONVERT_HINT = "set `model.opset: 13`"


def _export(tmp_path: Path, path: Path, opset: int | None) -> onnx.ModelProto:
    recipe = Recipe(name="t", model={"onnx": str(path), "opset": opset}, variants={"v": []})
    ctx = recipe.stage_context("exported", tmp_path / "work")
    ctx.work_dir.mkdir(parents=True, exist_ok=True)
    return export.run(None, recipe.model, ctx).model


def _data_sets(folder: Path) -> list[tuple[list[np.ndarray], list[np.ndarray]]]:
    def tensors(data_set: Path, kind: str) -> list[np.ndarray]:
        files = sorted(data_set.glob(f"{kind}_*.pb"), key=lambda path: int(path.stem.split("_")[-1]))
        return [numpy_helper.to_array(onnx.load_tensor(str(path))) for path in files]

    return [(tensors(data_set, "input"), tensors(data_set, "output"))
            for data_set in sorted(folder.glob("test_data_set_*"))]


def test_the_onnx_wheel_ships_the_old_pytorch_files() -> None:
    assert len(CASES) > 100


@pytest.mark.parametrize("path", CASES, ids=[path.parent.name for path in CASES])
def test_an_old_pytorch_file_is_taken_in_and_computes_its_own_expected_outputs(tmp_path: Path, path: Path) -> None:
    try:
        model = _export(tmp_path, path, None)
    except ModelError as exc:
        assert CONVERT_HINT in str(exc), exc  # the only refusal: an op version ONNX Runtime dropped
        model = _export(tmp_path, path, 13)
    initializers = {init.name for init in model.graph.initializer}
    assert not initializers & {value.name for value in model.graph.input}
    assert model.ir_version >= 4
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [value.name for value in session.get_inputs()]
    for inputs, expected in _data_sets(path.parent):
        outputs = session.run(None, dict(zip(names, inputs, strict=True)))
        for got, want in zip(outputs, expected, strict=True):
            np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-5)
