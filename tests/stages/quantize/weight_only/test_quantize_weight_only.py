"""quantize mode weight_only: int4/int8 blocked weights, float activations (decoders and LLMs)."""

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
from qdeploy.stages.quantize.weight_only._pack import block_quantize, pack_int4

K, N, VOCAB = 200, 48, 30
"""K is not a multiple of any power of two from 16 up: no block divides it (``_weight_blocks``)."""


def _dequantized(weight: np.ndarray, bits: int, group: int, symmetric: bool, axis: int) -> np.ndarray:
    """numpy reference: blocks of ``group`` along ``axis`` (zero-padded), quantized, dequantized."""
    moved = np.moveaxis(weight, axis, -1)
    length = moved.shape[-1]
    padded = np.pad(moved, [(0, 0)] * (moved.ndim - 1) + [(0, -length % group)])
    blocks = padded.reshape(*padded.shape[:-1], -1, group)
    q, scale, zero = block_quantize(blocks, bits, symmetric)
    values = (q.astype(np.float32) - (0 if zero is None else zero.astype(np.float32))) * scale
    return np.moveaxis(values.reshape(padded.shape)[..., :length], -1, axis)


def _matmul_gather_model(path: Path, seed: int = 0, k: int = K) -> tuple[np.ndarray, np.ndarray]:
    """ids -> Gather(table) [.., k] -> MatMul(w) [.., N]: an embedding and a projection; both weights returned."""
    rng = np.random.default_rng(seed)
    table = rng.standard_normal((VOCAB, k)).astype(np.float32)
    weight = (rng.standard_normal((k, N)) * 0.1).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("Gather", ["table", "ids"], ["h"], name="embed"),
         helper.make_node("MatMul", ["h", "w"], ["y"], name="proj")], "g",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, 5])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 5, N])],
        [numpy_helper.from_array(table, "table"), numpy_helper.from_array(weight, "w")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return table, weight


def test_block_quantize_uses_the_full_range_and_bounds_the_error() -> None:
    data = np.random.default_rng(1).standard_normal((6, 32)).astype(np.float32)
    for bits in (4, 8):
        q, scale, _ = block_quantize(data, bits, symmetric=True)
        assert q.min() >= -(2 ** (bits - 1)) and q.max() <= 2 ** (bits - 1) - 1
        assert (q == -(2 ** (bits - 1))).any(axis=-1).all()  # the extreme value of each block takes the end
        # the extreme maps to -2^(bits-1) exactly; the other side clips at 2^(bits-1)-1: at most one step off
        assert np.abs(q * scale - data).max() <= np.abs(scale).max() + 1e-6
        q, scale, zero = block_quantize(data, bits, symmetric=False)
        assert q.min() >= 0 and q.max() <= 2**bits - 1 and zero is not None
        assert np.abs((q.astype(np.float32) - zero) * scale - data).max() <= scale.max() / 2 + 1e-6


def test_int4_values_pack_two_per_byte_low_nibble_first() -> None:
    assert pack_int4(np.array([1, 2, -1, 7, 3], np.int8)) == bytes([0x21, 0x7F, 0x03])


@pytest.mark.parametrize(("bits", "symmetric", "weight_format"),
                         [(4, True, "matmulnbits"), (4, False, "matmulnbits"), (8, True, "matmulnbits"),
                          (4, True, "dequantize_linear"), (8, False, "dequantize_linear")])
def test_each_form_computes_what_the_numpy_reference_dequantizes(tmp_path: Path, bits: int, symmetric: bool,
                                                                 weight_format: str) -> None:
    """ORT runs the written weights (accuracy_level 0: float compute, so the only error is the weights') and
    gets x @ dequantize(W) and dequantize(table)[ids], with the reference's blocks: 3 blocks of 64 along K=192
    for MatMulNBits/GatherBlockQuantized; one block per channel along K=200 in the opset-21 form."""
    k = 192 if weight_format == "matmulnbits" else K
    table, weight = _matmul_gather_model(tmp_path / "float.onnx", k=k)
    config = QuantizeConfig(mode="weight_only", bits=bits, group_size=64, symmetric_weights=symmetric,
                            weight_format=weight_format, accuracy_level=0, lm_head="same")
    report = quantize_file(tmp_path / "float.onnx", tmp_path / "wo.onnx", config)
    assert {entry["bits"] for entry in report.quantized.values()} == {bits} and len(report.quantized) == 2
    ids = np.array([[0, 3, 7, 29, 3]], np.int64)
    got = ort.InferenceSession(str(tmp_path / "wo.onnx"), providers=["CPUExecutionProvider"]).run(None,
                                                                                                   {"ids": ids})[0]
    # GatherBlockQuantized has no signed 8-bit form: int8 tables are uint8 with zero points
    gather_symmetric = symmetric if weight_format == "dequantize_linear" or bits == 4 else False
    # the opset-21 form needs blocks dividing 200; no power of two >= 16 does: one block per channel
    group = 64 if weight_format == "matmulnbits" else K
    assert {name: entry["block_size"] for name, entry in report.blocks.items()} == \
        ({} if weight_format == "matmulnbits" else {"table": K, "w": K})
    rows = _dequantized(table, bits, group, gather_symmetric, axis=1)[ids[0]]
    expected = rows @ _dequantized(weight, bits, group, symmetric, axis=0)
    np.testing.assert_allclose(got[0], expected, rtol=1e-4, atol=1e-4)
    model = onnx.load(str(tmp_path / "wo.onnx"), load_external_data=False)
    ops = {node.op_type for node in model.graph.node}
    assert ops == ({"MatMulNBits", "GatherBlockQuantized"} if weight_format == "matmulnbits"
                   else {"DequantizeLinear", "MatMul", "Gather"})
    assert (tmp_path / "wo.onnx").stat().st_size < 10_000  # every weight is in the one data file beside it


def test_lm_head_and_embedding_policies(tmp_path: Path) -> None:
    """The MatMul whose output is the graph output is the LM head: int8 by default, float on request."""
    _matmul_gather_model(tmp_path / "float.onnx", k=192)
    report = quantize_file(tmp_path / "float.onnx", tmp_path / "a.onnx", QuantizeConfig(mode="weight_only"))
    assert report.quantized["proj"]["bits"] == 8 and report.quantized["embed"]["bits"] == 4
    config = QuantizeConfig(mode="weight_only", lm_head="float", embeddings="float")
    report = quantize_file(tmp_path / "float.onnx", tmp_path / "b.onnx", config)
    assert report.quantized == {} and set(report.kept_float) == {"proj", "embed"}
    assert "LM head" in report.kept_float["proj"]


@pytest.mark.parametrize(("settings", "field"), [
    ({"mode": "weight_only", "group_size": 100}, "group_size"),
    ({"mode": "weight_only", "group_size": 8}, "group_size"),
    ({"mode": "ptq", "bits": 8}, "bits"),
    ({"mode": "dynamic", "weight_format": "dequantize_linear"}, "weight_format"),
    ({"mode": "weight_only", "tolerance": {"cosine_min": 0.99}}, "tolerance"),
    ({"mode": "weight_only", "op_types": ["Conv"]}, "Conv"),
    ({"mode": "weight_only", "bits": 3}, "bits"),
])
def test_settings_that_do_not_fit_the_mode_are_refused_by_name(settings: dict, field: str) -> None:
    with pytest.raises(ValidationError, match=field):
        QuantizeConfig(**settings)


def test_a_model_with_nothing_to_quantize_fails_the_variant_with_the_reason(tmp_path: Path) -> None:
    """float16 weights (weight_only placed after fp16) and convolutional models are refused in words."""
    from qdeploy.core.errors import StageError
    from qdeploy.stages import quantize
    from tests.helpers.quantize import save_artifact, stage_context, tiny_conv

    table = np.random.default_rng(0).standard_normal((VOCAB, K)).astype(np.float16)
    graph = helper.make_graph([helper.make_node("Gather", ["table", "ids"], ["h"], name="embed")], "g",
                              [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, 5])],
                              [helper.make_tensor_value_info("h", TensorProto.FLOAT16, [1, 5, K])],
                              [numpy_helper.from_array(table, "table")])
    half = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    config = QuantizeConfig(mode="weight_only")
    with pytest.raises(StageError, match="embed: float16 weight: put weight_only before fp16"):
        quantize.run(save_artifact(tmp_path, half), config, stage_context(tmp_path))
    with pytest.raises(StageError, match="use ptq or dynamic"):
        quantize.run(save_artifact(tmp_path, tiny_conv()), config, stage_context(tmp_path))


@pytest.mark.parametrize(("bits", "weight_format", "precision"),
                         [(4, "matmulnbits", "int4"), (4, "dequantize_linear", "int4"), (8, "matmulnbits", "int8"),
                          (8, "dequantize_linear", "int8")])
def test_an_artifact_with_4_bit_weights_is_int4(tmp_path: Path, bits: int, weight_format: str,
                                                precision: str) -> None:
    """Its validation and benchmark rows and its report read the artifact's precision: 4-bit weights are int4."""
    from qdeploy.core.context import Artifact, artifact_precision

    _matmul_gather_model(tmp_path / "float.onnx", k=192)
    config = QuantizeConfig(mode="weight_only", bits=bits, group_size=64, weight_format=weight_format,
                            lm_head="same")
    quantize_file(tmp_path / "float.onnx", tmp_path / "wo.onnx", config)
    artifact = Artifact(path=tmp_path / "wo.onnx", sidecar=tmp_path / "wo.json", key="k", sha256="s",
                        size_bytes=1, stages=("export", "simplify", "quantize"), parent=None)
    assert artifact.precision == precision
    assert artifact_precision(["export", "quantize"]) == "int8"  # without the file: int8, as before
