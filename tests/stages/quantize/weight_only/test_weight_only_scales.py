"""weight_only: scale estimation, float zero points, and a tied LM head read through ``Transpose(table)``."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from pydantic import ValidationError

from qdeploy.stages.quantize import QuantizeConfig
from qdeploy.stages.quantize.weight_only._build import quantize_file
from qdeploy.stages.quantize.weight_only._gptq import dequantize
from qdeploy.stages.quantize.weight_only._pack import block_quantize
from qdeploy.stages.quantize.weight_only._scales import estimate_blocks

K, N, V = 128, 96, 200


def _weighted_error(weight: np.ndarray, approx: np.ndarray, importance: np.ndarray) -> float:
    return float(np.sum(importance[:, None] * (weight - approx) ** 2))


def _rtn(weight: np.ndarray, group: int, symmetric: bool) -> np.ndarray:
    grouped = weight.reshape(-1, group, weight.shape[1]).transpose(0, 2, 1)
    q, scale, zero = block_quantize(grouped, 4, symmetric)
    values = (q.astype(np.float32) - (0 if zero is None else zero.astype(np.float32))) * scale
    return values.transpose(0, 2, 1).reshape(weight.shape)


@pytest.mark.parametrize("symmetric", [True, False])
def test_scale_estimation_lowers_the_weighted_error_of_round_to_nearest(symmetric: bool) -> None:
    rng = np.random.default_rng(0)
    weight = rng.standard_t(3, (K, N)).astype(np.float32) * 0.02  # heavy tails: extremes waste levels
    importance = rng.uniform(0.1, 1.0, K) * np.where(rng.random(K) < 0.05, 30.0, 1.0)
    ints, scales, zeros = estimate_blocks(weight, importance, 4, 32, symmetric)
    fitted = dequantize(ints, scales, zeros, 32, K)
    assert ints.min() >= (-8 if symmetric else 0) and ints.max() <= (7 if symmetric else 15)
    fitted_error = _weighted_error(weight, fitted, importance)
    rtn_error = _weighted_error(weight, _rtn(weight, 32, symmetric), importance)
    assert fitted_error < 0.9 * rtn_error


def test_float_zero_points_recover_weights_stored_on_a_shifted_4_bit_grid() -> None:
    """GGUF Q4_1 stores w = d*q + m with a float offset per block of 32: an integer zero point cannot sit there."""
    rng = np.random.default_rng(1)
    levels = rng.integers(0, 16, (K, N))
    levels[0::32], levels[1::32] = 0, 15  # Q4_1 takes d and m from the block's min and max: both are levels
    step = np.repeat(rng.uniform(0.001, 0.01, (K // 32, N)), 32, axis=0)
    offset = np.repeat(rng.uniform(-0.08, 0.0, (K // 32, N)), 32, axis=0)
    weight = (levels * step + offset).astype(np.float32)
    for float_zero, bound in ((True, 1e-6), (False, None)):
        ints, scales, zeros = estimate_blocks(weight, None, 4, 32, False, float_zero)
        assert zeros is not None and (zeros.dtype == np.float32) == float_zero
        error = float(np.abs(dequantize(ints, scales, zeros, 32, K) - weight).max())
        if bound is not None:
            assert error < bound
        else:
            assert error > 1e-4  # the integer zero point misses the grid's offset


def _tied_decoder(path: Path) -> tuple[Path, np.ndarray]:
    """ids -> Gather(E) -> MatMul(W1) -> Relu -> MatMul(h, Transpose(E)) -> logits: a head tied to the table."""
    rng = np.random.default_rng(2)
    table = (rng.standard_normal((V, K)) * 0.05).astype(np.float32)
    inits = [numpy_helper.from_array(table, "E"),
             numpy_helper.from_array((rng.standard_normal((K, K)) * 0.1).astype(np.float32), "W1")]
    nodes = [helper.make_node("Gather", ["E", "ids"], ["h0"], name="embed"),
             helper.make_node("MatMul", ["h0", "W1"], ["h1"], name="mlp"),
             helper.make_node("Relu", ["h1"], ["h2"], name="act"),
             helper.make_node("Transpose", ["E"], ["E_t"], name="tie", perm=[1, 0]),
             helper.make_node("MatMul", ["h2", "E_t"], ["logits"], name="head")]
    graph = helper.make_graph(nodes, "tied", [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, "s"])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, "s", V])], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path, table


def _logits(path: Path, ids: np.ndarray) -> np.ndarray:
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"ids": ids})[0]


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float(a.ravel() @ b.ravel() / np.linalg.norm(a) / np.linalg.norm(b))


def _config(**fields: object) -> object:
    config = QuantizeConfig.model_validate({"mode": "weight_only", **fields})
    return getattr(config, "root", config)


def test_a_tied_head_read_through_transpose_is_quantized_and_the_float_table_dropped(tmp_path: Path) -> None:
    source, _ = _tied_decoder(tmp_path / "tied.onnx")
    out = tmp_path / "q.onnx"
    report = quantize_file(source, out, _config(lm_head="int8"))
    model = onnx.load(str(out), load_external_data=False)
    assert report.quantized["head"]["bits"] == 8 and report.quantized["embed"]["bits"] == 4
    assert "Transpose" not in [node.op_type for node in model.graph.node]
    assert "E" not in {init.name for init in model.graph.initializer}  # no float copy of the table is left
    ids = np.random.default_rng(3).integers(0, V, (1, 12))
    assert _cosine(_logits(source, ids), _logits(out, ids)) > 0.98


def test_a_tied_head_left_float_keeps_the_table_and_its_transpose(tmp_path: Path) -> None:
    source, _ = _tied_decoder(tmp_path / "tied.onnx")
    out = tmp_path / "q.onnx"
    report = quantize_file(source, out, _config(lm_head="float"))
    model = onnx.load(str(out), load_external_data=False)
    assert "head" in report.kept_float and "embed" in report.quantized
    assert "Transpose" in [node.op_type for node in model.graph.node]
    assert "E" in {init.name for init in model.graph.initializer}
    ids = np.random.default_rng(4).integers(0, V, (1, 6))
    assert _cosine(_logits(source, ids), _logits(out, ids)) > 0.98


@pytest.mark.parametrize("fields", [
    {"scale_estimation": True},
    {"scale_estimation": True, "symmetric_weights": False, "zero_points": "float", "group_size": 32},
    {"method": "gptq", "scale_estimation": True, "symmetric_weights": False, "zero_points": "float",
     "group_size": 32, "lm_head": "same"},
    {"scale_estimation": True, "weight_format": "dequantize_linear"},
])
def test_fitted_artifacts_run_on_both_runtimes_alike(tmp_path: Path, fields: dict[str, object]) -> None:
    import openvino as ov

    source, _ = _tied_decoder(tmp_path / "tied.onnx")
    out = tmp_path / "q.onnx"
    calibration = [{"ids": np.random.default_rng(seed).integers(0, V, (1, 16))} for seed in range(4)]
    report = quantize_file(source, out, _config(**fields), calibration)
    assert all("scale_estimation" in one["method"] for one in report.quantized.values())
    ids = np.random.default_rng(5).integers(0, V, (1, 10))
    expected, on_ort = _logits(source, ids), _logits(out, ids)
    compiled = ov.Core().compile_model(str(out), "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    on_openvino = compiled({"ids": ids})[compiled.output(0)]
    assert _cosine(expected, on_ort) > 0.98 and _cosine(expected, on_openvino) > 0.98
    assert _cosine(on_ort, on_openvino) > 0.999  # the same weights (ORT quantizes activations per block: not equal)


def test_float_zero_points_are_written_as_float32_for_4_bit_blocks_only(tmp_path: Path) -> None:
    source, _ = _tied_decoder(tmp_path / "tied.onnx")
    out = tmp_path / "q.onnx"
    quantize_file(source, out, _config(symmetric_weights=False, zero_points="float", group_size=32,
                                       lm_head="int8"))
    model = onnx.load(str(out), load_external_data=False)
    types = {init.name: init.data_type for init in model.graph.initializer if init.name.endswith("_zero_points")}
    assert types["W1_q4_zero_points"] == TensorProto.FLOAT
    assert types["E_t_q8_zero_points"] == TensorProto.UINT8  # ORT's 8-bit MatMulNBits refuses float ones


@pytest.mark.parametrize("fields", [{"zero_points": "float"},
                                    {"zero_points": "float", "symmetric_weights": False,
                                     "weight_format": "dequantize_linear"}])
def test_float_zero_points_need_asymmetric_matmulnbits(fields: dict[str, object]) -> None:
    with pytest.raises(ValidationError, match="zero_points 'float'"):
        _config(**fields)


def test_scale_estimation_reads_calibration_data() -> None:
    assert _config(scale_estimation=True, calibration={"data": "calib"}).calibration is not None
    with pytest.raises(ValidationError, match="scale_estimation"):
        _config(calibration={"data": "calib"})


def test_calibration_statistics_are_computed_once_and_verified_before_reuse(tmp_path: Path) -> None:
    source, _ = _tied_decoder(tmp_path / "tied.onnx")
    calibration = [{"ids": np.random.default_rng(seed).integers(0, V, (1, 16))} for seed in range(3)]
    cache = tmp_path / "cache"
    first = quantize_file(source, tmp_path / "a.onnx", _config(scale_estimation=True), calibration, cache)
    second = quantize_file(source, tmp_path / "b.onnx", _config(method="gptq"), calibration, cache)
    assert not first.statistics_reused and second.statistics_reused
    again = quantize_file(source, tmp_path / "c.onnx", _config(scale_estimation=True), calibration, cache)
    assert again.statistics_reused
    assert (tmp_path / "a.onnx.data").read_bytes() == (tmp_path / "c.onnx.data").read_bytes()
    stored = next((cache / "weight_only").glob("*.npz"))
    stored.write_bytes(stored.read_bytes()[:-8] + b"\0" * 8)  # damaged on disk: never reused
    damaged = quantize_file(source, tmp_path / "d.onnx", _config(scale_estimation=True), calibration, cache)
    assert not damaged.statistics_reused
    assert (tmp_path / "a.onnx.data").read_bytes() == (tmp_path / "d.onnx.data").read_bytes()
    fresh = quantize_file(source, tmp_path / "f.onnx", _config(ratio=0.5), calibration)
    reused = quantize_file(source, tmp_path / "g.onnx", _config(ratio=0.5), calibration, cache)
    assert reused.statistics_reused and fresh.mixed is not None and reused.mixed == fresh.mixed  # variances too
    other_data = [{"ids": np.random.default_rng(9).integers(0, V, (1, 16))}]
    assert not quantize_file(source, tmp_path / "e.onnx", _config(scale_estimation=True), other_data,
                             cache).statistics_reused
