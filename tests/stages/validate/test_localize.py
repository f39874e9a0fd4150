"""Locating the first diverging node: tensor matching through fp16 Casts and Q/DQ pairs, and the search."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from qdeploy.core.tolerance import Tolerance
from qdeploy.stages.validate._localize import Localizer, match_tensors, scale_free
from tests.helpers.validate import chain_model, perturbed, to_fp16

FEEDS = {i: {"x": np.random.default_rng(i).standard_normal((3, 6)).astype(np.float32)} for i in range(2)}


def with_qdq_after(model: onnx.ModelProto, tensor: str, scale: float) -> onnx.ModelProto:
    """A copy where `tensor` goes through QuantizeLinear -> DequantizeLinear (int8) before its consumers."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    graph = copy.graph
    for node in graph.node:
        for index, name in enumerate(node.input):
            if name == tensor:
                node.input[index] = f"{tensor}_DequantizeLinear_Output"
    position = next(i for i, node in enumerate(graph.node) if tensor in node.output) + 1
    qdq = [helper.make_node("QuantizeLinear", [tensor, "s", "zp"], [f"{tensor}_q"], name=f"{tensor}_QuantizeLinear"),
           helper.make_node("DequantizeLinear", [f"{tensor}_q", "s", "zp"], [f"{tensor}_DequantizeLinear_Output"],
                            name=f"{tensor}_DequantizeLinear")]
    for offset, node in enumerate(qdq):
        graph.node.insert(position + offset, node)
    graph.initializer.extend([numpy_helper.from_array(np.array(scale, np.float32), "s"),
                              numpy_helper.from_array(np.array(0, np.int8), "zp")])
    onnx.checker.check_model(copy)
    return copy


def test_fp16_casts_are_skipped_and_blamed_on_their_producer() -> None:
    reference = chain_model()
    pairs = match_tensors(reference, to_fp16(reference))
    assert [pair.reference for pair in pairs] == ["h1", "r1", "h2", "r2", "h3", "r3", "h4", "r4", "logits"]
    logits = pairs[-1]
    assert (logits.candidate, logits.node, logits.op_type) == ("logits", "head", "MatMul")  # not the output Cast
    assert all(pair.op_type != "Cast" for pair in pairs)


def test_a_qdq_pair_is_compared_through_its_dequantized_value() -> None:
    reference = chain_model()
    pairs = {pair.reference: pair for pair in match_tensors(reference, with_qdq_after(reference, "h2", 0.05))}
    assert pairs["h2"].candidate == "h2_DequantizeLinear_Output"
    assert (pairs["h2"].node, pairs["h2"].op_type) == ("mm2", "MatMul")
    assert pairs["h1"].candidate == "h1"


@pytest.mark.parametrize(("snr_db_min", "expected"), [(60.0, ("mm2", "h2")), (10.0, None)])
def test_coarse_quantization_is_located_at_the_quantized_node(tmp_path: Path, snr_db_min: float,
                                                              expected: tuple[str, str] | None) -> None:
    reference = chain_model()
    onnx.save(reference, str(tmp_path / "ref.onnx"))
    onnx.save(with_qdq_after(reference, "h2", 0.05), str(tmp_path / "qdq.onnx"))  # ~30 dB of rounding noise
    divergence, why = Localizer(tmp_path / "ref.onnx", "ort:cpu").locate(
        tmp_path / "qdq.onnx", "ort:cpu", FEEDS, tolerance=Tolerance(snr_db_min=snr_db_min), pin_f32=True)
    if expected is None:
        assert divergence is None and why.startswith("none of the 9 intermediate tensors")
        return
    assert divergence is not None, why
    assert (divergence.node, divergence.tensor) == expected
    assert divergence.snr_db is not None and 15 < divergence.snr_db < snr_db_min
    assert divergence.compared == 3


def test_localizer_caches_reference_runs_and_finds_each_perturbation(tmp_path: Path) -> None:
    reference = chain_model()
    onnx.save(reference, str(tmp_path / "ref.onnx"))
    localizer = Localizer(tmp_path / "ref.onnx", "ort:cpu")
    for weight, node in (("w1", "mm1"), ("w3", "mm3"), ("w_head", "head")):
        path = tmp_path / f"{weight}.onnx"
        onnx.save(perturbed(reference, weight, 0.5), str(path))
        divergence, why = localizer.locate(path, "openvino:cpu", FEEDS, tolerance=Tolerance(cosine_min=0.9999,
                                                                                            snr_db_min=60),
                                           pin_f32=True)
        assert divergence is not None and divergence.node == node, why
    assert sorted(localizer._cache) == [0, 1]


def test_models_sharing_no_tensor_names_cannot_be_localized(tmp_path: Path) -> None:
    reference = chain_model()
    renamed = onnx.ModelProto()
    renamed.CopyFrom(reference)
    for node in renamed.graph.node:
        node.output[0] = f"other_{node.output[0]}"
        node.input[0] = node.input[0] if node.input[0] == "x" else f"other_{node.input[0]}"
    renamed.graph.output[0].name = "other_logits"
    onnx.save(reference, str(tmp_path / "ref.onnx"))
    onnx.save(renamed, str(tmp_path / "renamed.onnx"))
    divergence, why = Localizer(tmp_path / "ref.onnx", "ort:cpu").locate(
        tmp_path / "renamed.onnx", "ort:cpu", FEEDS, tolerance=Tolerance(cosine_min=0.99), pin_f32=True)
    assert divergence is None and why == "no intermediate tensor of the artifact shares a name with the reference"


def test_scale_free_keeps_cosine_and_snr_only() -> None:
    fallback = Tolerance(cosine_min=0.999, snr_db_min=30)
    assert scale_free(Tolerance(atol=0.1, top1_agreement_min=0.9), fallback) == fallback
    assert scale_free(Tolerance(cosine_min=0.9, atol=0.1), fallback) == Tolerance(cosine_min=0.9)


def test_input_casts_are_not_compared() -> None:
    graph = helper.make_graph(
        [helper.make_node("Cast", ["x"], ["x16"], name="in_cast", to=TensorProto.FLOAT16),
         helper.make_node("Relu", ["x16"], ["y"], name="relu")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT16, [2])])
    reference = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"], name="relu")], "r",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    pairs = match_tensors(helper.make_model(reference), helper.make_model(graph))
    assert [(p.reference, p.node) for p in pairs] == [("y", "relu")]


def test_a_quantized_tensor_one_level_off_at_a_tie_is_rounding_but_an_index_tensor_must_match() -> None:
    """Before: 'first diverging node ... QuantizeLinear: 1 of 128000 integer/bool elements differ; they must match
    exactly', where ORT and OpenVINO rounded one input feature of a pre-quantized Whisper encoder to neighbouring
    levels and the real divergence lay further on."""
    from qdeploy.stages.validate._localize import TensorPair, _first_divergence

    levels = np.random.default_rng(0).integers(0, 255, (1, 80, 1600)).astype(np.uint8)
    nudged = levels.copy()
    nudged[0, 3, 7] += 1
    indices = np.arange(12, dtype=np.int64).reshape(1, 12)
    moved = indices.copy()
    moved[0, 5] = 6
    pairs = [TensorPair("q", "q", "x_QuantizeLinear", "QuantizeLinear"), TensorPair("i", "i", "argmax", "ArgMax")]
    reference, candidate = [{"q": levels, "i": indices}], [{"q": nudged, "i": moved}]
    found, _ = _first_divergence(pairs, reference, candidate, scale_free(Tolerance(), Tolerance(cosine_min=0.999)))
    assert found is not None and found.node == "argmax" and "must match exactly" in found.reason
    coarse = (levels // 16 * 16).astype(np.uint8)  # a quantized tensor that really diverges is still found
    found, _ = _first_divergence(pairs, reference, [{"q": coarse, "i": indices}],
                                 scale_free(Tolerance(), Tolerance(cosine_min=0.9999)))
    assert found is not None and found.node == "x_QuantizeLinear"
