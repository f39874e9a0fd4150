"""`qdeploy check` refuses what a run would refuse: here, a quantize budget on a task metric without labels."""

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
model: {{onnx: m.onnx}}
data:
  calib: {{reader: npy, path: {data}}}
variants:
  int8: [{{quantize: {{calibration: {{data: calib}}, tolerance: {{metric: "metrics.py:accuracy", max_drop: 0.01}}}}}}]
targets: [ort:cpu]
benchmark: {{enabled: false}}
"""


def recipe(tmp_path: Path, labelled: bool, data: str = "calib") -> Path:
    onnx.save(make_model([helper.make_node("Gemm", ["x", "w"], ["logits"], name="fc")], [init("w", np.eye(4))],
                         {"x": [1, 4]}, {"logits": [1, 4]}), tmp_path / "m.onnx")
    (tmp_path / "metrics.py").write_text("def accuracy(outputs, labels):\n    return 1.0\n")
    folder = tmp_path / "calib"
    folder.mkdir()
    for index in range(4):
        extra = {"label": np.array([index % 4])} if labelled else {}
        np.savez(folder / f"{index}.npz", x=np.ones((1, 4), np.float32), **extra)
    return write_recipe(tmp_path, RECIPE.format(data=data))


def check(path: Path) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, ["check", str(path)])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result.exit_code, result.stdout, result.stderr


@pytest.mark.parametrize(("labelled", "code", "needle"), [
    (False, 2, "the budget dataset 'calib' has none: give its .npz samples a 'label'"),
    (True, 0, ""),
])
def test_check_refuses_a_task_metric_budget_without_labels(tmp_path: Path, labelled: bool, code: int,
                                                          needle: str) -> None:
    status, stdout, stderr = check(recipe(tmp_path, labelled))
    assert status == code, stderr
    if needle:
        assert needle in stderr and "variant 'int8'" in stderr
    else:  # the budget's metric is user code the run executes: check lists it for review
        assert "variants.int8.quantize.tolerance.metric: metrics.py:accuracy" in stdout
