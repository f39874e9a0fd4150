"""reference:cpu (onnx's reference evaluator): corrected where its kernels are wrong, `unavailable` where it cannot
run an op, and the true-float16 check of PP-OCRv4 det's fp16 artifact."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

import qdeploy.stages.validate as validate
from qdeploy.stages.validate import ValidateConfig
from tests.helpers.fp16 import run_ort, run_target
from tests.helpers.models import tiny_cnn
from tests.helpers.validate import artifact, by_pair, context

RECIPE = """
    name: t
    model: {onnx: model.onnx}
    variants: {v: []}
    targets: [ort:cpu]
    """


@pytest.mark.parametrize("opset", [9, 12, 15])
def test_batch_normalization_runs_in_inference_mode_at_every_opset(tmp_path: Path, opset: int) -> None:
    """onnx.reference's BatchNormalization-9 took the schema's default momentum for training mode: a one-output
    (inference) node normalised with the batch's own statistics (onnx/onnx#5799)."""
    model = tiny_cnn(opset=opset)
    x = {"input": np.random.default_rng(0).standard_normal((1, 3, 16, 16)).astype(np.float32) * 3 + 1}
    expected = run_ort(model, x)[0]
    np.testing.assert_allclose(run_target("reference:cpu", model, x, tmp_path)[0], expected, rtol=1e-4, atol=1e-4)


def test_global_max_pool_reduces_every_spatial_axis(tmp_path: Path) -> None:
    for shape in ([1, 4, 16], [1, 4, 3, 5, 6]):  # rank 3 and 5; the evaluator's own kernel is right at rank 4 only
        node = helper.make_node("GlobalMaxPool", ["x"], ["y"], name="pool")
        graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", 1, shape)],
                                  [helper.make_tensor_value_info("y", 1, None)])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
        x = {"x": np.random.default_rng(1).standard_normal(shape).astype(np.float32)}
        np.testing.assert_array_equal(run_target("reference:cpu", model, x, tmp_path)[0], run_ort(model, x)[0])


def _model_with(node: onnx.NodeProto, inits: list[onnx.TensorProto], opsets: list[tuple[str, int]]) -> onnx.ModelProto:
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", 1, [1, 4, 16])],
                              [helper.make_tensor_value_info("y", 1, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets], ir_version=8)


CANNOT_RUN = {
    # its kernel raises IndexError on a 1-D pool with SAME padding, which ONNX Runtime runs; qdeploy's own kernel
    # computes the values (tests/targets/test_evaluator_max_pool.py), onnx's still the Indices output
    "MaxPool": _model_with(helper.make_node("MaxPool", ["x"], ["y", "indices"], name="pool_same", kernel_shape=[3],
                                            auto_pad="SAME_UPPER"), [], [("", 17)]),
    # ONNX Runtime's contrib ops have no kernel in onnx.reference
    "FusedMatMul": _model_with(helper.make_node("FusedMatMul", ["x", "w"], ["y"], name="fused", domain="com.microsoft"),
                               [numpy_helper.from_array(np.ones((16, 2), np.float32), "w")],
                               [("", 17), ("com.microsoft", 1)]),
}


@pytest.mark.parametrize("op_type", list(CANNOT_RUN))
def test_an_op_the_evaluator_cannot_run_makes_the_row_unavailable_naming_it(tmp_path: Path, op_type: str) -> None:
    model = CANNOT_RUN[op_type]
    artifacts = {"exported": artifact(tmp_path / "ref.onnx", model),
                 "half": artifact(tmp_path / "half.onnx", model, stages=("export", "fp16"))}
    rows = by_pair(validate.run(artifacts, ["ort:cpu"], ValidateConfig(samples=2), context(tmp_path, RECIPE)))
    assert rows[("exported", "ort:cpu")].status == "passed"
    check = rows[("half", "reference:cpu")]  # the true-float16 check added for the fp16 artifact
    assert check.status == "unavailable", check
    assert op_type in check.reason and "onnx.reference" in check.reason
    if op_type == "MaxPool":
        assert "'pool_same'" in check.reason
