"""`qdeploy check` refuses an fp16 budget on a task metric without labels, and names the metric it uses (the
recipe's validate.metric when the tolerance names none)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper
from typer.testing import CliRunner

from qdeploy.cli import app
from tests.helpers.models import write_recipe
from tests.helpers.quantize import init, make_model

RECIPE = """
name: t
model: {onnx: m.onnx}
data:
  calib: {reader: npy, path: calib}
variants:
  half: [{fp16: {mode: auto, calibration: {data: calib, samples: 4}, tolerance: {max_drop: 0.01}}}]
targets: [ort:cpu]
validate: {metric: "metrics.py:accuracy"}
benchmark: {enabled: false}
"""


@pytest.mark.parametrize("labelled", [False, True])
def test_check_an_fp16_task_budget(tmp_path: Path, labelled: bool) -> None:
    onnx.save(make_model([helper.make_node("Gemm", ["x", "w"], ["logits"], name="fc")], [init("w", np.eye(4))],
                         {"x": [1, 4]}, {"logits": [1, 4]}), tmp_path / "m.onnx")
    (tmp_path / "metrics.py").write_text("def accuracy(outputs, labels):\n    return 1.0\n")
    (tmp_path / "calib").mkdir()
    for index in range(4):
        extra = {"label": np.array([index])} if labelled else {}
        np.savez(tmp_path / "calib" / f"{index}.npz", x=np.ones((1, 4), np.float32), **extra)
    result = CliRunner().invoke(app, ["check", str(write_recipe(tmp_path, RECIPE))])
    if labelled:
        assert result.exit_code == 0, result.stderr
        assert "variants.half.fp16.tolerance.metric: metrics.py:accuracy" in result.stdout
    else:
        assert result.exit_code == 2
        assert "variant 'half': the fp16 tolerance on a task metric" in result.stderr
        assert "the budget dataset 'calib' has none: give its .npz samples a 'label'" in result.stderr
