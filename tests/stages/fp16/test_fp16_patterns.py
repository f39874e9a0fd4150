"""What stays float32 without data: hand-written normalisations, ops whose schemas take float32 only, integer
accumulators of pre-quantized models, constants beyond float16's range.

Each model here converts "successfully" with plain onnxconverter-common (and with qdeploy before these rules)
and then computes zeros, Inf or a wrong result, or fails to load in ONNX Runtime.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from qdeploy.stages.fp16._patterns import integer_accumulators, normalizations, out_of_range_constants
from qdeploy.stages.fp16._types import all_types
from tests.helpers.fp16 import (
    const,
    make_model,
    prequantized_model,
    run_ort,
    run_reference,
    run_stage,
    tensor,
)

T, D = 8, 32


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    return float(np.dot(a, b) / (np.linalg.norm(a) * np.linalg.norm(b)))


def _large_activations(seed: int) -> np.ndarray:
    """Activations in the hundreds, as the residual stream of a deep LLM carries."""
    return (np.random.default_rng(seed).standard_normal((1, T, D)) * 300).astype(np.float32)


def _rms_norm(square: str, apply: str) -> onnx.ModelProto:
    """y = MatMul(weight * x / sqrt(mean(x^2) + eps), W), written out op by op as exporters do."""
    rng = np.random.default_rng(0)
    squared = (helper.make_node("Pow", ["x", "two"], ["sq"], name="square") if square == "pow"
               else helper.make_node("Mul", ["x", "x"], ["sq"], name="square"))
    nodes = [squared,
             helper.make_node("ReduceMean", ["sq"], ["ms"], name="mean_square", axes=[-1]),
             helper.make_node("Add", ["ms", "eps"], ["mse"], name="add_eps"),
             helper.make_node("Sqrt", ["mse"], ["rms"], name="rms")]
    if apply == "div":
        nodes.append(helper.make_node("Div", ["x", "rms"], ["normed"], name="normalize"))
    else:
        nodes += [helper.make_node("Reciprocal", ["rms"], ["inv"], name="inverse"),
                  helper.make_node("Mul", ["x", "inv"], ["normed"], name="normalize")]
    nodes += [helper.make_node("Mul", ["normed", "weight"], ["scaled"], name="weight"),
              helper.make_node("MatMul", ["scaled", "W"], ["y"], name="proj")]
    inits = [const("two", 2.0), const("eps", 1e-6), const("weight", rng.uniform(0.5, 1.5, D)),
             const("W", rng.standard_normal((D, D)) / np.sqrt(D))]
    return make_model(nodes, inits, [tensor("x", [1, T, D])], [tensor("y", [1, T, D])], opset=17)


@pytest.mark.parametrize(("square", "apply"), [("pow", "div"), ("mul", "reciprocal")])
def test_rms_norm_with_large_activations_stays_float32_and_is_right_in_true_float16(
        tmp_path: Path, square: str, apply: str) -> None:
    model = _rms_norm(square, apply)
    x = {"x": _large_activations(1)}
    expected = run_ort(model, x)[0]

    result = run_stage(tmp_path, model)  # no data: the pattern alone decides
    kept = result.findings.normalization_float32_nodes
    members = {"square", "mean_square", "add_eps", "rms", "normalize", "weight"} | (
        {"inverse"} if apply == "reciprocal" else set())
    assert set(kept) == members and "RMSNorm" in kept["normalize"]
    assert "proj" not in result.findings.node_block_list  # the projection stays float16
    got = run_reference(result.model, x)[0]  # every op in its declared precision
    assert np.isfinite(got).all() and np.abs(got).max() > 0.1
    assert _cosine(got, expected) > 0.999

    unguarded = run_stage(tmp_path, model, keep_layer_norms_float32=False).model  # what qdeploy built before
    assert np.abs(run_reference(unguarded, x)[0]).max() == 0.0  # x^2 overflows, x / Inf = 0: all zeros


def test_normalization_matcher_finds_layer_norm_and_l2_norm_but_not_a_plain_square() -> None:
    nodes = [helper.make_node("ReduceMean", ["x"], ["mu"], name="mu", axes=[-1]),
             helper.make_node("Sub", ["x", "mu"], ["c"], name="center"),
             helper.make_node("Mul", ["c", "c"], ["c2"], name="c_square"),
             helper.make_node("ReduceMean", ["c2"], ["var"], name="var", axes=[-1]),
             helper.make_node("Add", ["var", "eps"], ["ve"], name="ve"),
             helper.make_node("Pow", ["ve", "minus_half"], ["inv_std"], name="inv_std"),
             helper.make_node("Mul", ["c", "inv_std"], ["ln"], name="ln"),
             helper.make_node("ReduceL2", ["ln"], ["norm"], name="l2", axes=[-1]),
             helper.make_node("Max", ["norm", "tiny"], ["safe"], name="safe"),
             helper.make_node("Div", ["ln", "safe"], ["unit"], name="unit"),
             helper.make_node("Mul", ["unit", "unit"], ["sq"], name="plain_square"),
             helper.make_node("ReduceMean", ["sq"], ["energy"], name="energy", axes=[-1]),
             helper.make_node("Add", ["energy", "residual"], ["y"], name="not_a_norm")]
    inits = [const("eps", 1e-5), const("minus_half", -0.5), const("tiny", 1e-12)]
    model = make_model(nodes, inits, [tensor("x", [1, T, D]), tensor("residual", [1, T, 1])],
                       [tensor("y", [1, T, 1])])
    found = normalizations(model)
    assert {name for name, why in found.items() if "LayerNorm" in why} == {
        "mu", "center", "c_square", "var", "ve", "inv_std", "ln"}
    assert {name for name, why in found.items() if "L2" in why} == {"l2", "safe", "unit"}
    assert not {"plain_square", "energy", "not_a_norm"} & set(found)  # a square reduced, never applied to x




def test_pre_quantized_model_keeps_float32_where_its_schemas_and_accumulators_need_it(tmp_path: Path) -> None:
    model = prequantized_model(tmp_path)
    ops = {node.op_type for node in model.graph.node}
    assert {"ConvInteger", "MatMulInteger", "DynamicQuantizeLSTM"} <= ops
    rng = np.random.default_rng(3)
    samples = [{"img": (rng.standard_normal((1, 1, 6, 8)) * 4).astype(np.float32)} for _ in range(3)]

    result = run_stage(tmp_path, model)  # before: "Type 'tensor(float16)' of input parameter ... is invalid"
    assert result.findings.checker.endswith("loads in onnxruntime CPUExecutionProvider")
    lstm = next(node.name for node in model.graph.node if node.op_type == "DynamicQuantizeLSTM")
    assert "DynamicQuantizeLSTM" in result.findings.schema_float32_nodes[lstm]  # from ONNX Runtime's schema
    accumulators = result.findings.integer_accumulator_float32_nodes
    assert {model_op(model, name) for name in accumulators} == {"Cast", "Mul"}
    casts = [name for name in accumulators if model_op(model, name) == "Cast"]
    for sample in samples:
        assert _int32_peak(model, casts, sample) > 65504  # the head's int32 sums pass float16's range...
        expected, got = run_ort(model, sample)[0], run_ort(result.model, sample)[0]
        assert np.isfinite(got).all() and _cosine(got, expected) > 0.999  # ...and are cast to float32 here

    checked = run_stage(tmp_path, model, {"cal": samples}, calibration={"data": "cal"}, fidelity_check="reference")
    reference = checked.findings.fidelity["reference"]  # onnx.reference has no com.microsoft kernels
    assert reference["status"] == "unavailable" and reference["op_type"] == "DynamicQuantizeLSTM"


def _int32_peak(model: onnx.ModelProto, casts: list[str], sample: dict[str, np.ndarray]) -> float:
    """The largest magnitude of the int32 tensors those Casts read, on one sample."""
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    sources = [node.input[0] for node in model.graph.node if node.name in casts]
    probe.graph.output.extend(helper.make_tensor_value_info(name, onnx.TensorProto.INT32, None) for name in sources)
    return float(max(np.abs(array).max() for array in run_ort(probe, sample)[1:]))


def model_op(model: onnx.ModelProto, name: str) -> str:
    return next(node.op_type for node in model.graph.node if node.name == name)


def test_integer_accumulators_are_the_casts_of_int32_sums_of_8_bit_integers(tmp_path: Path) -> None:
    model = prequantized_model(tmp_path)
    found = integer_accumulators(model, all_types(onnx.shape_inference.infer_shapes(model)))
    sources = {why.split("'")[1] for why in found.values()}
    assert {model_op(model, name) for name in sources} == {"ConvInteger", "MatMulInteger"}


def _batch_norm_with_huge_variance() -> onnx.ModelProto:
    """A BatchNormalization whose running variance is ~1e8 (as in PP-OCRv4 det's last block)."""
    rng = np.random.default_rng(0)
    channels = 4
    inits = [const("scale", rng.uniform(0.8, 1.2, channels)), const("bias", rng.uniform(-0.3, 0.3, channels)),
             const("mean", rng.uniform(-300, 300, channels)), const("var", rng.uniform(1e7, 1e8, channels))]
    nodes = [helper.make_node("BatchNormalization", ["x", "scale", "bias", "mean", "var"], ["bn"], name="bn"),
             helper.make_node("Sigmoid", ["bn"], ["y"], name="sigmoid")]
    return make_model(nodes, inits, [tensor("x", [1, channels, 8, 8])], [tensor("y", [1, channels, 8, 8])],
                      opset=12)


def test_constants_beyond_float16_range_keep_their_readers_float32_instead_of_being_clamped(tmp_path: Path) -> None:
    model = _batch_norm_with_huge_variance()
    x = {"x": (np.random.default_rng(1).standard_normal((1, 4, 8, 8)) * 5000).astype(np.float32)}
    expected = run_ort(model, x)[0]

    result = run_stage(tmp_path, model)
    assert set(result.findings.constant_range_float32_nodes) == {"bn"}
    assert result.findings.clamp["clamped_values"] == 0
    assert _cosine(run_reference(result.model, x)[0], expected) > 0.9999

    clamped = run_stage(tmp_path, model, out_of_range_constants="clamp")  # onnxconverter-common's behaviour
    assert clamped.findings.clamp["clamped_values"] == 4
    assert _cosine(run_ort(clamped.model, x)[0], expected) < 0.99  # variance 1e8 -> 65504: 40x too steep


def test_infinity_stand_ins_are_clamped_without_keeping_anything_float32() -> None:
    nodes = [helper.make_node("Add", ["x", "mask"], ["masked"], name="mask"),
             helper.make_node("Clip", ["masked", "low", "high"], ["y"], name="clip")]
    inits = [const("mask", [0.0, -3.4028235e38]), const("low", -1e30), const("high", 3.4e38)]
    model = make_model(nodes, inits, [tensor("x", [2])], [tensor("y", [2])])
    assert out_of_range_constants(model, 65504.0) == {}


def test_an_out_of_range_value_in_any_piece_of_a_large_weight_is_found(monkeypatch: pytest.MonkeyPatch) -> None:
    import qdeploy.graph.utils as graph_utils

    monkeypatch.setattr(graph_utils, "CHUNK_VALUES", 3)  # pieces [1, 2, 3] [4, 9.1e4, 6] [7e4]
    values = np.array([1, 2, 3, 4, 9.1e4, 6, 7e4], np.float32)
    model = helper.make_model(helper.make_graph(
        [helper.make_node("Mul", ["x", "w"], ["y"], name="mul")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [7])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [7])], [numpy_helper.from_array(values, "w")]))
    found = out_of_range_constants(model, 65504.0)
    assert list(found) == ["mul"] and "9.1e+04" in found["mul"]  # the largest over every piece, not the last


def test_accumulating_scatters_stay_float32_and_the_artifact_runs(tmp_path: Path) -> None:
    """minimol's message sums: ONNX Runtime 1.32 loaded its float16 ScatterElements(add) and failed every run."""
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"),
             helper.make_node("ScatterElements", ["r", "idx", "upd"], ["s"], name="sum", axis=0, reduction="add"),
             helper.make_node("ScatterElements", ["s", "idx", "upd"], ["y"], name="put", axis=0)]
    graph = helper.make_graph(nodes, "g", [tensor("x", [4, 3]), tensor("upd", [2, 3]),
                                           helper.make_tensor_value_info("idx", TensorProto.INT64, [2, 3])],
                              [tensor("y", [4, 3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=8)
    sample = {"x": np.ones((4, 3), np.float32), "upd": np.full((2, 3), 0.5, np.float32),
              "idx": np.array([[0, 1, 2], [3, 0, 1]], np.int64)}

    result = run_stage(tmp_path, model, {"cal": [sample]}, calibration={"data": "cal"})

    assert set(result.findings.scatter_reduction_float32_nodes) == {"sum"}  # 'put' replaces: no sums
    np.testing.assert_allclose(run_ort(result.model, sample)[0], run_ort(model, sample)[0], rtol=1e-3)


def test_the_fp16_artifact_keeps_the_models_metadata(tmp_path: Path) -> None:
    """Before: metadata_props, doc strings and the model version were lost (a light copy was converted), and with
    them what deployments read (Ultralytics' class names; atspm-detector's 8 entries)."""
    model = make_model([helper.make_node("Relu", ["x"], ["y"], name="relu")], [], [tensor("x", [2, 4])],
                       [tensor("y", [2, 4])])
    onnx.helper.set_model_props(model, {"names": "{0: 'person'}", "stride": "32"})
    model.doc_string, model.graph.doc_string, model.model_version, model.domain = "a model", "its graph", 7, "ai.x"
    model.producer_name, model.producer_version = "exporter", "1.2"

    converted = run_stage(tmp_path, model).model

    assert {prop.key: prop.value for prop in converted.metadata_props} == {"names": "{0: 'person'}", "stride": "32"}
    assert (converted.doc_string, converted.graph.doc_string, converted.model_version, converted.domain) == (
        "a model", "its graph", 7, "ai.x")
    assert (converted.producer_name, converted.producer_version) == ("exporter", "1.2")
