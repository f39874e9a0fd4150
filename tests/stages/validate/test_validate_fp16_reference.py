"""fp16 artifacts are also checked on reference:cpu (true float16 arithmetic) when no GPU target is available."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from qdeploy.pipeline.recipe.loader import load_recipe_file
from qdeploy.pipeline.run.runner import RunOptions, run_recipe
from tests.helpers.models import write_recipe


def _overflowing_model(path: Path) -> None:
    """y = (x * 1000) * 0.001: the intermediate leaves float16's range (65504) for |x| > 65."""
    nodes = [helper.make_node("Mul", ["x", "big"], ["h"], name="scale_up"),
             helper.make_node("Mul", ["h", "small"], ["y"], name="scale_down")]
    inits = [numpy_helper.from_array(np.array(1000.0, np.float32), "big"),
             numpy_helper.from_array(np.array(0.001, np.float32), "small")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)


def _run(tmp_path: Path, fp16_reference: str) -> tuple[dict, int]:
    _overflowing_model(tmp_path / "m.onnx")
    recipe = write_recipe(tmp_path, f"""
        name: t
        model:
          onnx: m.onnx
          inputs: [{{name: x, shape: [1, 64], low: 100, high: 200}}]
        variants:
          plain16: [{{fp16: {{fidelity_check: "off"}}}}]
        targets: [ort:cpu]
        validate: {{samples: 2, fp16_reference: {fp16_reference}, tolerance: {{cosine_min: 0.99}}}}
        benchmark: {{enabled: false}}
        """)
    result = run_recipe(load_recipe_file(recipe), RunOptions(out_dir=tmp_path / "out", show_progress=False))
    return json.loads((tmp_path / "out" / "report.json").read_text()), result.exit_code


def test_true_fp16_check_catches_what_the_cpu_provider_hides(tmp_path: Path) -> None:
    report, code = _run(tmp_path, "auto")
    rows = {(row["variant"], row["target"]): row for row in report["validation"]}
    check = rows[("plain16", "reference:cpu")]
    assert check["status"] == "failed" and check["added"]
    assert check["metrics"]["nonfinite"] > 0 and "NaN/Inf" in check["reason"]
    assert "scale_up" in check["reason"]  # the node where float16 overflows is named
    assert code == 1 and report["passed"] is False


def test_true_fp16_check_can_be_turned_off(tmp_path: Path) -> None:
    report, _ = _run(tmp_path, "never")
    assert not [row for row in report["validation"] if row["target"] == "reference:cpu"]
