"""A detector with NonMaxSuppression inside: scores that nearly tie are kept by value in float32 and by index
once float16 makes them equal, so the selected boxes differ while every tensor before NMS agrees.  Validation
names NMS as the first diverging node and says why (``_localize.SELECTION_OPS``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from qdeploy.pipeline.recipe.loader import load_recipe_file
from qdeploy.pipeline.run.runner import RunOptions, run_recipe
from tests.helpers.models import write_recipe

BOXES = 64


def nms_model() -> onnx.ModelProto:
    """x [1, 64] -> scores 0.5 + 1e-4 * (x @ w): apart by less than float16's step at 0.5 (2.4e-4); 64 disjoint
    constant boxes; NonMaxSuppression keeps the 10 best -> selected indices [10, 3]."""
    rng = np.random.default_rng(0)
    corners = np.arange(BOXES, dtype=np.float32)[:, None] * 10.0
    boxes = np.concatenate([corners, corners, corners + 5.0, corners + 5.0], axis=1)[None]  # y1 x1 y2 x2
    weights = [numpy_helper.from_array(rng.standard_normal((BOXES, BOXES)).astype(np.float32) / 8, "w"),
               numpy_helper.from_array(np.array(1e-4, np.float32), "small"),
               numpy_helper.from_array(np.array(0.5, np.float32), "half"),
               numpy_helper.from_array(np.array([1, 1, BOXES], np.int64), "score_shape"),
               numpy_helper.from_array(boxes, "boxes"),
               numpy_helper.from_array(np.array([10], np.int64), "keep"),
               numpy_helper.from_array(np.array([0.5], np.float32), "iou"),
               numpy_helper.from_array(np.array([0.0], np.float32), "threshold")]
    nodes = [helper.make_node("MatMul", ["x", "w"], ["logits"], name="score_mm"),
             helper.make_node("Mul", ["logits", "small"], ["spread"], name="spread"),
             helper.make_node("Add", ["spread", "half"], ["flat_scores"], name="offset"),
             helper.make_node("Reshape", ["flat_scores", "score_shape"], ["scores"], name="to_scores"),
             helper.make_node("NonMaxSuppression", ["boxes", "scores", "keep", "iou", "threshold"], ["selected"],
                              name="nms")]
    graph = helper.make_graph(nodes, "detector", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, BOXES])],
                              [helper.make_tensor_value_info("selected", TensorProto.INT64, [10, 3])], weights)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


RECIPE = """
    name: nms
    model: {{onnx: model.onnx}}
    variants: {{fp16: [fp16]}}
    targets: [ort:cpu]
    validate: {{samples: 4, fp16_reference: never{outputs}}}
    benchmark: {{enabled: false}}
    """


def _fp16_row(tmp_path: Path, outputs: str = "") -> dict[str, Any]:
    onnx.save(nms_model(), str(tmp_path / "model.onnx"))
    recipe = load_recipe_file(write_recipe(tmp_path, RECIPE.format(outputs=outputs)))
    report = run_recipe(recipe, RunOptions(out_dir=tmp_path / "out", show_progress=False)).report
    return next(row for row in report["validation"] if row["variant"] == "fp16")


def test_a_selection_that_flips_on_near_ties_is_named_with_its_cause(tmp_path: Path) -> None:
    row = _fp16_row(tmp_path)
    assert row["status"] == "failed" and "integer/bool elements differ" in row["reason"]
    assert row["divergence"]["node"] == "nms" and row["divergence"]["op_type"] == "NonMaxSuppression"
    assert row["divergence"]["compared"] > 1  # the scores before it were compared, and agree
    assert "selection by value flips where values nearly tie" in row["reason"]


def test_per_output_limits_may_allow_a_share_of_the_selection_to_differ(tmp_path: Path) -> None:
    row = _fp16_row(tmp_path, ", outputs: {selected: {mismatch_max: 0.5}}")
    assert row["status"] == "passed", row["reason"]
    assert row["tolerance"] is not None and row["outputs"][0]["tolerance"]["mismatch_max"] == 0.5
