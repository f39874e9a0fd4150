"""quantize mode weight_only: the block of each weight divides its quantized axis, so OpenVINO reads the artifact
as ONNX Runtime does (``stages/quantize/weight_only/_blocks.py``)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from qdeploy.stages import quantize
from qdeploy.stages.quantize import QuantizeConfig
from qdeploy.stages.quantize.weight_only._build import quantize_file
from qdeploy.stages.quantize.weight_only._pack import block_quantize
from tests.helpers.quantize import artifact_at, stage_context

HIDDEN = 96
"""The decoder's width: not a multiple of the default group_size 128 (a 135M decoder's 576 is not either)."""


def _openvino_outputs(path: Path, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    ov = pytest.importorskip("openvino")
    compiled = ov.Core().compile_model(ov.Core().read_model(str(path)), "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    result = compiled(feeds)
    return [np.asarray(result[port]) for port in compiled.outputs]


def _ort_outputs(path: Path, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    import onnxruntime as ort

    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)


@pytest.fixture(scope="module")
def decoder(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, object]:
    pytest.importorskip("transformers")
    from tests.helpers.decoder import export

    return export(tmp_path_factory.mktemp("decoder") / "decoder.onnx", layers=1, hidden=HIDDEN, vocab=300)


def test_default_int4_of_a_decoder_whose_width_is_not_a_multiple_of_128_runs_on_openvino(
        tmp_path: Path, decoder: tuple[Path, object]) -> None:
    """group_size 128 over a 96-wide embedding and 96-long K: blocks of 32, recorded per weight; OpenVINO reads,
    compiles and runs the artifact and agrees with ONNX Runtime."""
    from tests.helpers.decoder import feeds

    path, config = decoder
    result = quantize.run(artifact_at(path), QuantizeConfig(mode="weight_only"), stage_context(tmp_path))
    findings = result.findings
    assert findings.group_size == 128
    blocks = {entry["block_size"] for entry in findings.blocks.values()}
    assert blocks == {32} and all(entry["axis"] == HIDDEN for entry in findings.blocks.values())
    assert any("not a multiple of group_size 128" in entry["why"] or "shorter" in entry["why"]
               for entry in findings.blocks.values())
    model = result.model
    gathers = [node for node in model.graph.node if node.op_type == "GatherBlockQuantized"]
    assert gathers and all(helper.get_attribute_value(next(a for a in node.attribute if a.name == "block_size")) == 32
                           for node in gathers)
    saved = tmp_path / "int4.onnx"
    onnx.save(model, str(saved), save_as_external_data=True, location="int4.onnx.data")
    inputs = feeds(config, prompt=6)
    expected = _ort_outputs(saved, inputs)[0]
    got = _openvino_outputs(saved, inputs)[0]
    assert got.shape == expected.shape
    np.testing.assert_allclose(got, expected, atol=2e-2 * float(np.abs(expected).max()))


def _matmul_model(path: Path, k: int, n: int = 24) -> np.ndarray:
    weight = (np.random.default_rng(0).standard_normal((k, n)) * 0.1).astype(np.float32)
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["h"], name="proj"),
                               helper.make_node("Relu", ["h"], ["y"], name="act")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, k])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, n])],
                              [numpy_helper.from_array(weight, "w")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return weight


@pytest.mark.parametrize(("k", "group", "block"), [(64, 1024, 64), (512, 1024, 256), (576, 128, 64)])
def test_a_group_that_does_not_fit_the_axis_becomes_the_largest_block_that_does(tmp_path: Path, k: int, group: int,
                                                                              block: int) -> None:
    """group_size 1024 on K=64 used to end in MLAS' raw "MlasQuantizeBlockwise" failure; now the block is the
    axis (64), or 256 (the most ONNX Runtime's block quantizer writes), or the largest power of two dividing K."""
    weight = _matmul_model(tmp_path / "float.onnx", k)
    config = QuantizeConfig(mode="weight_only", group_size=group, lm_head="same", accuracy_level=0)
    report = quantize_file(tmp_path / "float.onnx", tmp_path / "wo.onnx", config)
    assert report.quantized["proj"]["block_size"] == block and report.blocks["w"]["block_size"] == block
    model = onnx.load(str(tmp_path / "wo.onnx"), load_external_data=False)
    node = next(node for node in model.graph.node if node.op_type == "MatMulNBits")
    assert helper.get_attribute_value(next(a for a in node.attribute if a.name == "block_size")) == block
    x = np.random.default_rng(1).standard_normal((2, k)).astype(np.float32)
    want = np.maximum(x @ _dequantized(weight, block, 4), 0)  # blocks of ``block`` along K
    scale = float(np.abs(want).max())
    np.testing.assert_allclose(_ort_outputs(tmp_path / "wo.onnx", {"x": x})[0], want, atol=1e-5 * scale)
    # OpenVINO's CPU plugin quantizes the activations of compressed weights per group at run time: about 1% off
    np.testing.assert_allclose(_openvino_outputs(tmp_path / "wo.onnx", {"x": x})[0], want, atol=3e-2 * scale)


def test_a_stage_with_a_group_larger_than_the_axis_builds(tmp_path: Path) -> None:
    """Through the stage, as ``qdeploy run`` calls it: built, the choice in the findings."""
    _matmul_model(tmp_path / "float.onnx", 64)
    result = quantize.run(artifact_at(tmp_path / "float.onnx"),
                          QuantizeConfig(mode="weight_only", group_size=1024, lm_head="same"),
                          dataclasses.replace(stage_context(tmp_path), targets=("ort:cpu", "openvino:cpu")))
    assert result.findings.blocks["w"]["block_size"] == 64
    assert "shorter than group_size 1024" in result.findings.blocks["w"]["why"]


@pytest.mark.parametrize("symmetric", [True, False])
def test_an_axis_no_block_divides_stays_int8_with_a_scale_per_channel(tmp_path: Path, symmetric: bool) -> None:
    """K=200: no power of two from 16 divides it; MatMulNBits would pad it (OpenVINO refuses that for tables).
    The weight is int8 with one scale per output column, in a DequantizeLinear every runtime reads."""
    weight = _matmul_model(tmp_path / "float.onnx", 200)
    config = QuantizeConfig(mode="weight_only", symmetric_weights=symmetric, lm_head="same")
    report = quantize_file(tmp_path / "float.onnx", tmp_path / "wo.onnx", config)
    assert report.quantized["proj"]["bits"] == 8 and report.quantized["proj"]["block_size"] is None
    assert "int8 with one scale per output channel" in report.blocks["w"]["why"]
    model = onnx.load(str(tmp_path / "wo.onnx"), load_external_data=False)
    assert [node.op_type for node in model.graph.node] == ["DequantizeLinear", "MatMul", "Relu"]
    x = np.random.default_rng(1).standard_normal((2, 200)).astype(np.float32)
    want = np.maximum(x @ _dequantized(weight, 200, 8, symmetric), 0)  # one group per column: the whole of K
    # both runtimes may run the int8 MatMul on activations quantized at run time: about 1% off
    for run in (_ort_outputs, _openvino_outputs):
        np.testing.assert_allclose(run(tmp_path / "wo.onnx", {"x": x})[0], want, atol=2e-2 * np.abs(want).max())


def _dequantized(weight: np.ndarray, block: int, bits: int, symmetric: bool = True) -> np.ndarray:
    """numpy reference of a [K, N] weight quantized in blocks of ``block`` along K (K a multiple of it)."""
    k, n = weight.shape
    blocks = weight.T.reshape(n, k // block, block)
    q, scale, zero = block_quantize(blocks, bits, symmetric)
    values = (q.astype(np.float32) - (0 if zero is None else zero.astype(np.float32))) * scale
    return values.reshape(n, k).T
