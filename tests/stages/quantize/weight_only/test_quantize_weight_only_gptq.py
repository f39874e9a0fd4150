"""quantize mode weight_only, data-aware: ``method: gptq`` and the int4/int8 ``ratio`` by measured sensitivity."""

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
from qdeploy.stages.quantize.weight_only._pack import block_quantize, matmulnbits_tensors, packed_matmulnbits

K = 192
"""Not a multiple of 128: MatMulNBits' last block is partial (padded)."""


def _outlier_feeds(count: int, seed: int, gain_at: tuple[int, ...] = (3, 50, 97, 140)) -> list[dict[str, np.ndarray]]:
    """LLM-like activations: correlated channels (a fixed mixing) and a few outlier channels 20x larger."""
    mixing = np.random.default_rng(123).standard_normal((K, K)).astype(np.float32) / np.sqrt(K)
    gain = np.ones(K, np.float32)
    gain[list(gain_at)] = 20.0
    rng = np.random.default_rng(seed)
    return [{"x": ((rng.standard_normal((1, 16, K)) @ mixing) * gain).astype(np.float32)} for _ in range(count)]


def _chain(path: Path, names: tuple[str, ...] = ("a", "b", "c"), boost: str | None = None) -> Path:
    """x -> MatMul a -> MatMul b -> MatMul c (K x K, seeded) -> Tanh -> y: no MatMul is the LM
    head; ``boost``'s input is multiplied by 30 on a few channels (an outlier structure in front of it)."""
    rng = np.random.default_rng(0)
    nodes, inits, current = [], [], "x"
    for name in names:
        if name == boost:
            scale = np.ones(K, np.float32)
            scale[[5, 17, 60]] = 30.0
            inits.append(numpy_helper.from_array(scale, f"{name}_boost"))
            nodes.append(helper.make_node("Mul", [current, f"{name}_boost"], [f"{name}_in"], name=f"{name}_mul"))
            current = f"{name}_in"
        inits.append(numpy_helper.from_array((rng.standard_normal((K, K)) * 0.05).astype(np.float32), f"w_{name}"))
        nodes.append(helper.make_node("MatMul", [current, f"w_{name}"], [f"{name}_out"], name=name))
        current = f"{name}_out"
    nodes.append(helper.make_node("Tanh", [current], ["y"], name="out"))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, K])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, K])], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def _output_mse(model: Path, reference: Path, feeds: list[dict[str, np.ndarray]]) -> float:
    quantized = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    exact = ort.InferenceSession(str(reference), providers=["CPUExecutionProvider"])
    return float(np.mean([np.mean((quantized.run(None, f)[0] - exact.run(None, f)[0]) ** 2) for f in feeds]))


@pytest.fixture(scope="module")
def chain(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _chain(tmp_path_factory.mktemp("chain") / "float.onnx")


@pytest.mark.parametrize("symmetric", [True, False])
def test_packed_integers_are_laid_out_as_ort_writes_them(symmetric: bool) -> None:
    """The layout GPTQ's integers are written in is ORT's own: round to nearest's integers packed by it give ORT's
    kernel's bytes (asymmetric: ORT's rounding differs in a rare tie, by one level)."""
    weight = np.random.default_rng(2).standard_normal((K, 40)).astype(np.float32)
    for bits in (4, 8):
        theirs = matmulnbits_tensors(weight, bits, 128, symmetric)
        grouped = np.pad(weight, ((0, 256 - K), (0, 0))).reshape(2, 128, 40).transpose(0, 2, 1)
        q, scale, zero = block_quantize(grouped, bits, symmetric)
        ours = packed_matmulnbits(q.transpose(0, 2, 1).reshape(256, 40), scale[..., 0],
                                  None if zero is None else zero[..., 0], bits, 128)
        assert ours[1] == theirs[1] and ours[2] == theirs[2]
        differ = np.frombuffer(ours[0][0], np.uint8) != np.frombuffer(b"".join(theirs[0]), np.uint8)
        assert differ.sum() <= (0 if symmetric else 3)


@pytest.mark.parametrize(("weight_format", "symmetric"), [("matmulnbits", True), ("matmulnbits", False),
                                                          ("dequantize_linear", True)])
def test_gptq_cuts_the_output_error_of_round_to_nearest(chain: Path, weight_format: str, symmetric: bool) -> None:
    """Same bits, same tensors: on held-out inputs with outlier channels GPTQ's output error is well under RTN's."""
    calibration, held_out = _outlier_feeds(12, seed=1), _outlier_feeds(6, seed=2)
    errors = {}
    for method in ("rtn", "gptq"):
        config = QuantizeConfig(mode="weight_only", method=method, group_size=32, weight_format=weight_format,
                                symmetric_weights=symmetric, accuracy_level=0)
        out = chain.with_name(f"{method}-{weight_format}-{symmetric}.onnx")
        report = quantize_file(chain, out, config, calibration if method == "gptq" else None)
        assert {entry["method"] for entry in report.quantized.values()} == {method}
        assert {entry["bits"] for entry in report.quantized.values()} == {4}
        errors[method] = _output_mse(out, chain, held_out)
    assert errors["gptq"] < 0.6 * errors["rtn"], errors


@pytest.mark.parametrize(("sensitivity", "said"), [("max_variance", "variance"),
                                                  ("output_error", "int4 output error")])
def test_ratio_keeps_the_most_sensitive_matmul_int8(tmp_path: Path, sensitivity: str, said: str) -> None:
    """b reads an input with outlier channels: its int4 output error and its input's variance are the largest,
    so ratio 0.67 (two of three equal weights in int4) keeps b in int8, and the report says what it measured."""
    source = _chain(tmp_path / "float.onnx", boost="b")
    config = QuantizeConfig(mode="weight_only", ratio=0.67, group_size=32, ratio_sensitivity=sensitivity)
    report = quantize_file(source, tmp_path / "mixed.onnx", config, _outlier_feeds(4, seed=1))
    assert {name: entry["bits"] for name, entry in report.quantized.items()} == {"a": 4, "b": 8, "c": 4}
    assert report.mixed is not None and report.mixed["kept_int8"] == ["b"]
    assert max(report.mixed["scores"], key=report.mixed["scores"].get) == "b"
    assert report.mixed["int4_share"] == pytest.approx(2 / 3, abs=1e-3) and said in report.mixed["sensitivity"]
    assert report.calibration_samples == 4


def test_max_variance_is_nncfs_statistic_over_each_sample(tmp_path: Path) -> None:
    """The pass records, per input, the largest per-channel variance along a sample's rows averaged over the
    samples (not the pooled variance: a channel whose mean moves between samples is not variance), and X'X/rows."""
    from qdeploy.stages.quantize.weight_only._data import activation_hessians

    source = _chain(tmp_path / "float.onnx", names=("a",))
    rng = np.random.default_rng(3)
    feeds = [{"x": (rng.standard_normal((1, 16, K)) + 100.0 * index).astype(np.float32)} for index in range(3)]
    statistics = activation_hessians(source, onnx.load(str(source)), ["x"], feeds)
    expected = np.mean([feed["x"][0].var(axis=0).max() for feed in feeds])
    assert statistics.samples == 3 and statistics.max_variance["x"] == pytest.approx(expected, rel=1e-5)
    rows = np.concatenate([feed["x"][0] for feed in feeds])
    np.testing.assert_allclose(statistics.hessians["x"], rows.T @ rows / len(rows), rtol=1e-4)


def test_max_variance_favours_precise_weights_on_outlier_inputs(tmp_path: Path) -> None:
    """NNCF's score divides by the weight's int8 noise: of two MatMuls reading the same input, the one with the
    smaller weights (less int8 noise) ranks higher; output_error ranks the larger weights higher (more error)."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array((rng.standard_normal((K, K)) * scale).astype(np.float32), f"w_{name}")
             for name, scale in (("big", 0.2), ("small", 0.02))]
    nodes = [helper.make_node("MatMul", ["x", f"w_{name}"], [f"{name}_out"], name=name) for name in ("big", "small")]
    nodes.append(helper.make_node("Add", ["big_out", "small_out"], ["y"], name="add"))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, K])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, K])], inits)
    source = tmp_path / "two.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(source))
    kept = {}
    for sensitivity in ("max_variance", "output_error"):
        config = QuantizeConfig(mode="weight_only", ratio=0.5, group_size=32, ratio_sensitivity=sensitivity)
        report = quantize_file(source, tmp_path / f"{sensitivity}.onnx", config, _outlier_feeds(4, seed=1))
        assert report.mixed is not None
        kept[sensitivity] = report.mixed["kept_int8"]
    assert kept == {"max_variance": ["small"], "output_error": ["big"]}


def test_gptq_artifacts_run_on_both_runtimes_through_the_stage(tmp_path: Path) -> None:
    """Through the stage (random calibration data), the artifact loads and runs on ort:cpu and openvino:cpu
    with the same results, and the findings record the method, the data and the ratio's choice."""
    import openvino as ov

    from qdeploy.stages import quantize
    from tests.helpers.quantize import artifact_at, stage_context

    source = _chain(tmp_path / "float.onnx", boost="b")
    config = QuantizeConfig(mode="weight_only", method="gptq", ratio=0.67, group_size=32,
                            calibration={"samples": 3})
    result = quantize.run(artifact_at(source), config, stage_context(tmp_path))
    found = result.findings.model_dump()
    assert found["method"] == "gptq" and found["calibration"] == {"data": "random", "samples": 3,
                                                                  "statistics_reused": False}
    assert found["mixed"]["kept_int8"] == ["b"] and found["quantized_weights"] == {"MatMul int4": 2,
                                                                                    "MatMul int8": 1}
    path = tmp_path / "work" / "weight_only.onnx"
    feed = {"x": np.random.default_rng(5).standard_normal((1, 16, K)).astype(np.float32)}
    on_ort = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feed)[0]
    on_openvino = ov.Core().compile_model(str(path), "CPU", {"INFERENCE_PRECISION_HINT": "f32"})(feed)["y"]
    exact = ort.InferenceSession(str(source), providers=["CPUExecutionProvider"]).run(None, feed)[0]
    assert np.corrcoef(on_ort.ravel(), exact.ravel())[0, 1] > 0.95  # 4-bit weights of three chained MatMuls
    # the same weights on both: they differ only by ORT's int8 activations (accuracy_level 4) and rounding
    assert np.corrcoef(on_openvino.ravel(), on_ort.ravel())[0, 1] > 0.99


@pytest.mark.parametrize(("settings", "message"), [
    ({"method": "awq"}, "'rtn' or 'gptq'"),
    ({"ratio": 0}, "greater than 0"),
    ({"ratio": 1.5}, "less than or equal to 1"),
    ({"bits": 8, "ratio": 0.5}, "needs bits 4"),
    ({"ratio_sensitivity": "output_error"}, "ranks MatMuls for a ratio below 1"),
    ({"calibration": {"samples": 8}}, "calibration is read only by method gptq, ratio below 1, scale_estimation or "
                                      "awq"),
    ({"method": "gptq", "calibration": {"samples": 0}}, "samples"),
    ({"act_order": True}, "act_order orders GPTQ's walk over the rows: it needs method gptq"),
    ({"awq": True, "bits": 8}, "awq scales int4 weights: it needs bits 4"),
])
def test_bad_data_settings_are_refused_in_words(settings: dict, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        QuantizeConfig(mode="weight_only", **settings)


@pytest.mark.parametrize("symmetric", [True, False])
def test_act_order_keeps_the_block_layout_and_cuts_the_output_error_further(symmetric: bool) -> None:
    """Act-order with static groups: the same block layout (integers in range, one scale per contiguous block,
    taken from the blocks before any update), and on inputs with outlier channels a lower output error than GPTQ
    in the natural order, itself well under round to nearest's."""
    from qdeploy.stages.quantize.weight_only._gptq import dequantize, gptq, output_error, rtn_dequantized

    rng = np.random.default_rng(4)
    inputs = np.concatenate([feed["x"].reshape(-1, K) for feed in _outlier_feeds(24, seed=3)]).astype(np.float64)
    hessian = inputs.T @ inputs / len(inputs)
    weight = (rng.standard_normal((K, 48)) * 0.05).astype(np.float32)
    errors = {"rtn": output_error(weight, rtn_dequantized(weight, 4, 32, symmetric), hessian)}
    for act_order in (False, True):
        ints, scales, zeros = gptq(weight, hessian, 4, 32, symmetric, act_order=act_order)
        assert ints.shape == (K, 48) and scales.shape == (K // 32, 48)
        assert ints.min() >= (-8 if symmetric else 0) and ints.max() <= (7 if symmetric else 15)
        errors[act_order] = output_error(weight, dequantize(ints, scales, zeros, 32, K), hessian)
    _, static, _ = gptq(weight, hessian, 4, 32, symmetric, act_order=True)
    _, rtn_scales, _ = block_quantize(weight.reshape(K // 32, 32, 48).transpose(0, 2, 1), 4, symmetric)
    np.testing.assert_allclose(static, rtn_scales[..., 0], rtol=1e-6)  # static groups: round to nearest's scales
    assert errors[True] < errors[False] < 0.6 * errors["rtn"], errors


def test_act_order_runs_through_the_stage_and_says_so(chain: Path) -> None:
    calibration = _outlier_feeds(8, seed=1)
    config = QuantizeConfig(mode="weight_only", method="gptq", act_order=True, group_size=32, accuracy_level=0)
    out = chain.with_name("act-order.onnx")
    report = quantize_file(chain, out, config, calibration)
    assert {entry["method"] for entry in report.quantized.values()} == {"gptq+act_order"}
    rtn = chain.with_name("act-order-rtn.onnx")
    quantize_file(chain, rtn, QuantizeConfig(mode="weight_only", group_size=32, accuracy_level=0), None)
    held_out = _outlier_feeds(4, seed=2)
    assert _output_mse(out, chain, held_out) < 0.6 * _output_mse(rtn, chain, held_out)


@pytest.mark.parametrize(("method", "weight_format"), [("rtn", "matmulnbits"), ("gptq", "matmulnbits"),
                                                        ("gptq", "dequantize_linear")])
def test_awq_divides_the_input_by_the_scales_its_weights_were_rounded_with(chain: Path, method: str,
                                                                          weight_format: str) -> None:
    """awq on inputs with outlier channels: each MatMul input gets one Mul by 1/s in front (the artifact stays
    weight-only and computes the same function up to rounding), the search's alpha and error are reported, and the
    held-out output error falls well below the same method's without awq, on ONNX Runtime and OpenVINO alike."""
    ov = pytest.importorskip("openvino")
    calibration, held_out = _outlier_feeds(12, seed=1), _outlier_feeds(6, seed=2)
    errors = {}
    for awq in (False, True):
        config = QuantizeConfig(mode="weight_only", method=method, awq=awq, group_size=32, accuracy_level=0,
                                weight_format=weight_format,
                                calibration={"samples": 12} if method == "rtn" and awq else None)
        out = chain.with_name(f"awq-{method}-{weight_format}-{awq}.onnx")
        report = quantize_file(chain, out, config, calibration if awq or method == "gptq" else None)
        errors[awq] = _output_mse(out, chain, held_out)
        if awq:
            muls = [node for node in onnx.load(str(out), load_external_data=False).graph.node if node.op_type == "Mul"]
            scaled = {name for name, found in report.awq.items() if found["alpha"] > 0}
            assert scaled and {node.input[0] for node in muls} == scaled, report.awq
            assert all(0 < found["error_ratio"] <= 1 for found in report.awq.values())
            assert {entry["method"] for entry in report.quantized.values()} == {f"{method}+awq"}
            on_openvino = ov.Core().compile_model(str(out), "CPU", {"INFERENCE_PRECISION_HINT": "f32"})(held_out[0])
            on_ort = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"]).run(None, held_out[0])[0]
            # the same weights: they differ by OpenVINO's int8 activations (its dynamic quantization) and rounding
            assert np.corrcoef(on_openvino["y"].ravel(), on_ort.ravel())[0, 1] > 0.999
    assert errors[True] < 0.8 * errors[False], errors
