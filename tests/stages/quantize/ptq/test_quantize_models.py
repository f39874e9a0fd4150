"""Quantize on model shapes other exporters write: integer inputs with ai.onnx.ml ops (tf2onnx classifiers),
Gemm biases of every broadcastable shape, third-party quantizer failures, and models already quantized in any
of their forms (standard and com.microsoft ops, Q/DQ inside subgraphs)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from qdeploy.core.errors import StageError
from qdeploy.stages import quantize
from qdeploy.stages.quantize import QuantizeConfig
from tests.helpers.quantize import cosine, init, make_model, run_ort, save_artifact, stage_context

CLASSES = ["text", "image", "archive", "binary"]


def run_unfused(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """ONNX Runtime without graph optimizations: Q/DQ run as written (float math on dequantized values), so the
    result does not depend on the CPU's int8 path (AVX2's U8S8 kernels saturate, VNNI's do not)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"]).run(None, feeds)


def tf2onnx_classifier(width: int = 64) -> onnx.ModelProto:
    """int32 bytes -> Cast -> scale -> (MatMul + [1, N] Add) x 2 -> Softmax -> ZipMap, ArgMax -> LabelEncoder.

    The [1, N] bias rows are what tf2onnx writes for Keras Dense layers; ORT's pre-processing fuses each
    MatMul + Add into a Gemm whose C is [1, N].
    """
    rng = np.random.default_rng(0)
    nodes = [
        helper.make_node("Cast", ["bytes"], ["as_float"], to=TensorProto.FLOAT, name="cast"),
        helper.make_node("Mul", ["as_float", "inv255"], ["scaled"], name="scale"),
        helper.make_node("MatMul", ["scaled", "w1"], ["h"], name="dense1/MatMul"),
        helper.make_node("Add", ["h", "b1"], ["hb"], name="dense1/BiasAdd"),
        helper.make_node("Relu", ["hb"], ["r"], name="dense1/Relu"),
        helper.make_node("MatMul", ["r", "w2"], ["logits0"], name="dense2/MatMul"),
        helper.make_node("Add", ["logits0", "b2"], ["logits"], name="dense2/BiasAdd"),
        helper.make_node("Softmax", ["logits"], ["probabilities"], axis=-1, name="softmax"),
        helper.make_node("ArgMax", ["probabilities"], ["index"], axis=1, keepdims=0, name="argmax"),
        helper.make_node("LabelEncoder", ["index"], ["label"], domain="ai.onnx.ml", name="labels",
                         keys_int64s=list(range(len(CLASSES))), values_strings=CLASSES, default_string="?"),
        helper.make_node("ZipMap", ["probabilities"], ["scores"], domain="ai.onnx.ml", name="zipmap",
                         classlabels_strings=CLASSES),
    ]
    inits = [init("inv255", 1 / 255), init("w1", rng.standard_normal((width, 32)) * 0.3),
             init("b1", rng.uniform(-0.2, 0.2, (1, 32))), init("w2", rng.standard_normal((32, len(CLASSES))) * 0.4),
             init("b2", rng.uniform(-0.2, 0.2, (1, len(CLASSES))))]
    score_map = helper.make_map_type_proto(TensorProto.STRING, helper.make_tensor_type_proto(TensorProto.FLOAT, []))
    graph = helper.make_graph(
        nodes, "classifier", [helper.make_tensor_value_info("bytes", TensorProto.INT32, ["batch", width])],
        [helper.make_tensor_value_info("label", TensorProto.STRING, ["batch"]),
         helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, ["batch", len(CLASSES)]),
         helper.make_value_info("scores", helper.make_sequence_type_proto(score_map))], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13), helper.make_opsetid("ai.onnx.ml", 2)],
                              ir_version=8, producer_name="tf2onnx")
    onnx.checker.check_model(model, full_check=True)
    return model


def test_integer_input_classifier_with_ml_ops_gets_its_float_part_quantized(tmp_path: Path) -> None:
    model = tf2onnx_classifier()
    data = tmp_path / "bytes"
    data.mkdir()
    rng = np.random.default_rng(4)
    for index in range(16):
        np.save(data / f"{index}.npy", rng.integers(0, 256, (1, 64)).astype(np.int32))
    config = QuantizeConfig(calibration={"data": "bytes"}, verify_targets=[])
    result = quantize.run(save_artifact(tmp_path, model), config, stage_context(tmp_path, {"bytes": data}))
    ops = {(node.domain, node.op_type) for node in result.model.graph.node}
    assert {("ai.onnx.ml", "ZipMap"), ("ai.onnx.ml", "LabelEncoder"), ("", "Cast")} <= ops
    assert sum(result.findings.quantized_nodes.get(op, 0) for op in ("Gemm", "MatMul")) == 2
    assert result.findings.gemm_bias_vectorized == 2  # the [1, N] biases ORT's quantizer cannot index
    assert any(entry.domain == "ai.onnx.ml" for entry in result.model.opset_import)

    feed = {"bytes": np.random.default_rng(5).integers(0, 256, (16, 64)).astype(np.int32)}
    expected, actual = run_ort(model, feed), run_unfused(result.model, feed)
    assert cosine(expected[1], actual[1]) > 0.999  # probabilities
    assert np.mean(expected[0] == actual[0]) >= 0.9  # labels, through the ml ops
    assert actual[2][0].keys() == set(CLASSES)


@pytest.mark.parametrize(("bias_shape", "beta"), [((), 1.0), ((1,), 1.0), ((1, 6), 0.5), ((4, 6), 1.0), ((4, 1), 2.0),
                                                  ((6,), 0.5)])
def test_gemm_bias_of_any_broadcastable_shape_is_quantized_exactly(tmp_path: Path, bias_shape: tuple[int, ...],
                                                                    beta: float) -> None:
    """Gemm's C may be anything that broadcasts to [M, N]; ORT's quantizer indexes it as a 1-D [N] vector."""
    rng = np.random.default_rng(1)
    weight = rng.standard_normal((6, 8)).astype(np.float32)  # transB: [N, K]
    nodes = [helper.make_node("Gemm", ["x", "w", "c"], ["y"], name="fc", transB=1, beta=beta)]
    model = make_model(nodes, [init("w", weight), init("c", rng.uniform(-1, 1, bias_shape))], {"x": [4, 8]}, ["y"])
    x = rng.standard_normal((4, 8)).astype(np.float32)
    (tmp_path / "x").mkdir()
    np.save(tmp_path / "x" / "0.npy", x)  # calibrated on the input it is checked on: only rounding remains
    result = quantize.run(save_artifact(tmp_path, model), QuantizeConfig(calibration={"data": "x"}, verify_targets=[]),
                          stage_context(tmp_path, {"x": tmp_path / "x"}))
    assert result.findings.quantized_nodes.get("Gemm") == 1
    expected, actual = run_ort(model, {"x": x})[0], run_unfused(result.model, {"x": x})[0]
    assert expected.shape == actual.shape == (4, 6)
    assert np.max(np.abs(expected - actual)) < 0.03 * np.max(np.abs(expected))


def test_a_failure_inside_onnxruntimes_quantizer_is_a_stage_error_naming_the_step(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Whatever ORT's quantizer trips over next, the user reads which tool failed where, not a numpy message."""
    from onnxruntime.quantization import qdq_quantizer

    def broken(self: object, node: onnx.NodeProto) -> bool:
        if node.op_type == "Gemm":
            raise ValueError("The truth value of an array with more than one element is ambiguous")
        return False

    monkeypatch.setattr(qdq_quantizer.QDQQuantizer, "should_quantize_node", broken)
    model = make_model([helper.make_node("Gemm", ["x", "w"], ["y"], name="fc")], [init("w", np.ones((8, 6)))],
                       {"x": [4, 8]}, ["y"])
    with pytest.raises(StageError, match=r"ONNX Runtime's QDQ quantizer failed on node 'fc' in "
                                         r"onnxruntime\.quantization .*exclude_nodes"):
        quantize.run(save_artifact(tmp_path, model), QuantizeConfig(verify_targets=[]), stage_context(tmp_path))


# ---- models that are already quantized ----------------------------------------------------------------------


def _one_node(op_type: str, inputs: list[str], domain: str = "", **attributes: object) -> onnx.ModelProto:
    """A model whose one node is op_type (inputs named; initializers are not needed to be refused)."""
    node = helper.make_node(op_type, inputs, ["y"], name="q", domain=domain, **attributes)
    domains = ("com.microsoft",) if domain == "com.microsoft" else ()
    return make_model([node], [], {name: [1, 4] for name in inputs if name}, ["y"], domains=domains)


def _qdq_inside_a_branch() -> onnx.ModelProto:
    """Q/DQ inside the then-branch of an If (exporters put quantized bodies in control flow)."""
    scale, zero = init("s", 0.1), init("z", 0, np.uint8)
    then = helper.make_graph([helper.make_node("QuantizeLinear", ["x", "s", "z"], ["xq"]),
                              helper.make_node("DequantizeLinear", ["xq", "s", "z"], ["t"])], "then", [],
                             [helper.make_tensor_value_info("t", TensorProto.FLOAT, None)], [scale, zero])
    other = helper.make_graph([helper.make_node("Identity", ["x"], ["e"])], "else", [],
                              [helper.make_tensor_value_info("e", TensorProto.FLOAT, None)])
    node = helper.make_node("If", ["flag"], ["y"], then_branch=then, else_branch=other, name="branch")
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4]),
                                            helper.make_tensor_value_info("flag", TensorProto.BOOL, [])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


ALREADY_QUANTIZED = {
    "ConvInteger": lambda: _one_node("ConvInteger", ["x", "w"]),
    "MatMulInteger": lambda: _one_node("MatMulInteger", ["x", "w"]),
    "QLinearConv": lambda: _one_node("QLinearConv", ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz"]),
    "QLinearMatMul": lambda: _one_node("QLinearMatMul", ["a", "as", "az", "b", "bs", "bz", "ys", "yz"]),
    "DynamicQuantizeLSTM": lambda: _one_node("DynamicQuantizeLSTM", ["x", "w", "r", "", "", "", "", "", "ws", "wz",
                                                                     "rs", "rz"], "com.microsoft", hidden_size=4),
    "QLinearAdd": lambda: _one_node("QLinearAdd", ["a", "as", "az", "b", "bs", "bz", "ys", "yz"], "com.microsoft"),
    "QGemm": lambda: _one_node("QGemm", ["a", "as", "az", "b", "bs", "bz"], "com.microsoft"),
    "QAttention": lambda: _one_node("QAttention", ["x", "w", "b", "xs", "ws"], "com.microsoft", num_heads=1),
    "MatMulNBits": lambda: _one_node("MatMulNBits", ["x", "w", "ws"], "com.microsoft", K=4, N=4, bits=4,
                                     block_size=16),
    "MulInteger": lambda: _one_node("MulInteger", ["a", "as", "az", "b"], "com.microsoft"),
    "QOrderedMatMul": lambda: _one_node("QOrderedMatMul", ["a", "as", "b", "bs", "ys"], "com.microsoft"),
    "GatherBlockQuantized": lambda: _one_node("GatherBlockQuantized", ["w", "i", "ws"], "com.microsoft"),
    "QEmbedLayerNormalization": lambda: _one_node("QEmbedLayerNormalization", ["ids", "seg", "we", "pe"],
                                                  "com.microsoft"),
    "QuantizeLinear inside an If": _qdq_inside_a_branch,
}


@pytest.mark.parametrize("mode", ["ptq", "dynamic"])
@pytest.mark.parametrize("form", sorted(ALREADY_QUANTIZED))
def test_an_already_quantized_model_is_refused_in_every_form(tmp_path: Path, form: str, mode: str) -> None:
    model = ALREADY_QUANTIZED[form]()
    op_type = form.split()[0]
    with pytest.raises(StageError, match=rf"already quantized \(\d+ quantization nodes: .*{op_type} \d+.*\); "
                                         "quantizing it again would compound the error"):
        quantize.run(save_artifact(tmp_path, model), QuantizeConfig(mode=mode, verify_targets=[]),
                     stage_context(tmp_path))


def test_a_float_model_with_look_alike_op_names_is_not_taken_for_quantized(tmp_path: Path) -> None:
    """QuickGelu starts with Q, Integer-free names: only real quantization ops count."""
    from qdeploy.stages.quantize.ptq._prepare import count_quantized_nodes

    assert count_quantized_nodes(_one_node("QuickGelu", ["x"], "com.microsoft")) == 0
    assert count_quantized_nodes(tf2onnx_classifier()) == 0
