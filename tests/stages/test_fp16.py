"""The fp16 stage: clamping counted, float32 I/O kept, ORT agreement, activation-aware blocking."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from pydantic import ValidationError

from pipeline.context import Artifact, StageContext
from pipeline.errors import StageError
from stages import fp16
from stages.fp16 import Fp16Config
from stages.quantize import CalibrationRef

# ---- helpers (kept in this file on purpose) -------------------------------------------------


def _model(nodes: list[onnx.NodeProto], inits: list[onnx.TensorProto], shape: list[int],
           out_shape: list[int] | None = None) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, out_shape or shape)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.checker.check_model(model)
    return model


def _artifact(tmp_path: Path, model: onnx.ModelProto) -> Artifact:
    path = tmp_path / "model.onnx"
    onnx.save(model, str(path))
    return Artifact(path=path, sidecar=path.with_suffix(".json"), key="k", sha256="s",
                    size_bytes=path.stat().st_size, stages=("export",), parent=None)


def _ctx(tmp_path: Path, low: float | None = None, high: float | None = None) -> StageContext:
    inputs = [SimpleNamespace(name="x", low=low, high=high)] if low is not None else []
    recipe = SimpleNamespace(data={}, model=SimpleNamespace(inputs=inputs), resolve=lambda p: tmp_path / p)
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    return StageContext(recipe=recipe, variant="v", work_dir=work)  # type: ignore[arg-type]


def _run_ort(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0]


def _tiny_conv() -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array((rng.standard_normal((4, 3, 3, 3)) * 0.3).astype(np.float32), "w"),
             numpy_helper.from_array((rng.standard_normal(4) * 0.1).astype(np.float32), "b")]
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["y"], name="relu")]
    return _model(nodes, inits, [1, 3, 8, 8], [1, 4, 8, 8])


def _overflowing() -> onnx.ModelProto:
    """x (about 100) * 1000 -> Max -> Max -> * 0.001: the middle overflows float16 (Max has fp16 CPU kernels)."""
    inits = [numpy_helper.from_array(np.array(1000, np.float32), "k"),
             numpy_helper.from_array(np.array(0.001, np.float32), "k_inv"),
             numpy_helper.from_array(np.array(0, np.float32), "zero")]
    nodes = [helper.make_node("Mul", ["x", "k"], ["up"], name="scale_up"),
             helper.make_node("Max", ["up", "zero"], ["m1"], name="max1"),
             helper.make_node("Max", ["m1", "zero"], ["m2"], name="max2"),
             helper.make_node("Mul", ["m2", "k_inv"], ["y"], name="scale_down")]
    return _model(nodes, inits, [1, 4])


# ---- tests ----------------------------------------------------------------------------------


def test_clamping_is_counted_and_uses_float16_limits(tmp_path: Path) -> None:
    values = np.array([1e6, -1e6, 1e-9, 0.5, 0.0], np.float32)
    model = _model([helper.make_node("Mul", ["x", "c"], ["y"], name="mul")],
                   [numpy_helper.from_array(values, "c")], [1, 5])
    result = fp16.run(_artifact(tmp_path, model), Fp16Config(), _ctx(tmp_path))

    clamp = result.findings["clamp"]
    assert clamp["clamped_values"] == 3
    assert clamp["initializers"] == {"c": 3}
    assert clamp["max_finite_val"] == 65504.0
    # 1e-9 raised to 5.96e-8 is the largest relative change: (5.96e-8 - 1e-9) / 1e-9
    assert clamp["max_relative_change"] == pytest.approx((5.96e-8 - 1e-9) / 1e-9, rel=1e-3)
    constant = numpy_helper.to_array(next(i for i in result.model.graph.initializer if i.name == "c"))
    assert constant.dtype == np.float16
    assert constant[0] == 65504 and constant[1] == -65504  # not the converter's default of 1e4
    assert constant[2] > 0 and constant[4] == 0


def test_keep_io_types_keeps_float32_io(tmp_path: Path) -> None:
    kept = fp16.run(_artifact(tmp_path, _tiny_conv()), Fp16Config(), _ctx(tmp_path)).model
    assert kept.graph.input[0].type.tensor_type.elem_type == TensorProto.FLOAT
    assert kept.graph.output[0].type.tensor_type.elem_type == TensorProto.FLOAT
    assert {i.data_type for i in kept.graph.initializer} == {TensorProto.FLOAT16}

    bare = fp16.run(_artifact(tmp_path, _tiny_conv()), Fp16Config(keep_io_types=False), _ctx(tmp_path)).model
    assert bare.graph.input[0].type.tensor_type.elem_type == TensorProto.FLOAT16
    assert bare.graph.output[0].type.tensor_type.elem_type == TensorProto.FLOAT16


def test_converted_conv_matches_fp32_in_ort(tmp_path: Path) -> None:
    model = _tiny_conv()
    result = fp16.run(_artifact(tmp_path, model), Fp16Config(), _ctx(tmp_path))
    assert result.changed and result.findings["cast_nodes_added"] == 2
    assert result.findings["clamp"]["clamped_values"] == 0
    assert result.findings["op_block_list"] and "Resize" in result.findings["op_block_list"]
    x = np.random.default_rng(1).standard_normal((1, 3, 8, 8)).astype(np.float32)
    expected, got = _run_ort(model, x), _run_ort(result.model, x)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, expected, rtol=5e-3, atol=5e-3)


def test_activation_aware_blocking_keeps_overflowing_nodes_in_fp32(tmp_path: Path) -> None:
    x = np.linspace(90, 110, 4, dtype=np.float32).reshape(1, 4)
    plain = fp16.run(_artifact(tmp_path, _overflowing()), Fp16Config(op_block_list=[]), _ctx(tmp_path))
    assert plain.findings["kept_in_fp32"] == []
    assert np.isinf(_run_ort(plain.model, x)).all()

    config = Fp16Config(op_block_list=[], calibration=CalibrationRef(data=None, samples=4))
    aware = fp16.run(_artifact(tmp_path, _overflowing()), config, _ctx(tmp_path, low=90.0, high=110.0))
    kept = {entry["node"]: entry for entry in aware.findings["kept_in_fp32"]}
    assert set(kept) == {"scale_up", "max1", "max2", "scale_down"}
    assert kept["scale_up"]["tensor"] == "up" and 9e4 < kept["scale_up"]["abs_max"] < 1.1e5
    assert set(aware.findings["node_block_list"]) == set(kept)
    out = _run_ort(aware.model, x)
    assert out.dtype == np.float32 and np.isfinite(out).all()
    np.testing.assert_allclose(out, x, rtol=1e-3)


def test_unknown_block_node_is_a_stage_error(tmp_path: Path) -> None:
    with pytest.raises(StageError, match="nope"):
        fp16.run(_artifact(tmp_path, _tiny_conv()), Fp16Config(node_block_list=["nope"]), _ctx(tmp_path))


def test_config_survives_a_json_round_trip() -> None:
    config = Fp16Config(calibration=CalibrationRef(data="calib"), node_block_list=["a"])
    assert Fp16Config(**config.model_dump(mode="json")) == config


@pytest.mark.parametrize("bad", [
    {"min_positive_val": 1e5, "max_finite_val": 100.0},
    {"max_finite_val": 70000.0},
    {"min_positive_val": 0.0},
    {"unknown": 1},
])
def test_bad_config_is_rejected(bad: dict) -> None:
    with pytest.raises(ValidationError):
        Fp16Config(**bad)
