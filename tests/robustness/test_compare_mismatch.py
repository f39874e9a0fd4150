"""`qdeploy compare` on real runs: two different models are refused (exit 2, saying what differs), and a
median latency that became NaN is a regression (exit 1) even without thresholds."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.robustness.helpers import recipe_with_model, run_cli

BODY = """
name: NAME
model: {onnx: MODEL}
variants:
  fp32: [simplify]
  fp16: [simplify, fp16]
targets: [ort:cpu]
validate: {reference: fp32, samples: 2}
benchmark: {batch_sizes: [BATCH], warmup: 0, iterations: 3, rounds: 1}
"""


def _matmul_4x4() -> onnx.ModelProto:
    weight = numpy_helper.from_array(np.eye(4, dtype=np.float32) * 0.5, "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "mm",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 4])], [weight])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _run(folder: Path, name: str, model: onnx.ModelProto | None = None, batch: int = 1) -> Path:
    folder.mkdir()
    recipe = recipe_with_model(folder, model, body=BODY.replace("NAME", name).replace("BATCH", str(batch)))
    result = run_cli("run", str(recipe), "-q", "--out", str(folder / "out"))
    assert result.returncode == 0, result.stderr[-2000:]
    return folder / "out"


@pytest.mark.slow  # two runs; tests/pipeline/results/test_compare_runs.py covers the same refusals on the fast loop
def test_compare_refuses_different_models_and_flags_nan(tmp_path: Path) -> None:
    cnn = _run(tmp_path / "cnn", "cnn")
    matmul = _run(tmp_path / "mm", "mm", _matmul_4x4(), batch=4)  # its batch dimension is a static 4

    refused = run_cli("compare", str(cnn), str(matmul))
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "not comparable" in refused.stderr and "model inputs differ" in refused.stderr
    assert "input float [1, 3, 16, 16]" in refused.stderr and "x float [4, 4]" in refused.stderr
    assert "Traceback" not in refused.stderr
    forced = run_cli("compare", str(cnn), str(matmul), "--allow-mismatch")
    assert "WARNING" in forced.stdout and "recipe name differs: 'cnn' vs 'mm'" in forced.stdout

    report = json.loads((cnn / "report.json").read_text())
    for row in report["benchmarks"]:
        row["latency_ms"]["p50"] = float("nan")
    (tmp_path / "nan.json").write_text(json.dumps(report))
    nan = run_cli("compare", str(cnn), str(tmp_path / "nan.json"))
    assert nan.returncode == 1, nan.stdout + nan.stderr
    assert "REGRESSION fp32 on ort:cpu, batch 1" in nan.stdout and "no regression" not in nan.stdout
