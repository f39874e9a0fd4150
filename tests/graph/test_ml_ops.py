"""Simple ``ai.onnx.ml`` operators for OpenVINO: its ONNX frontend converts none but Normalizer, so a scikit-learn
pipeline (a StandardScaler before a network: surfaces-onnx-files' regressor) could not be read on openvino:cpu.
qdeploy's OpenVINO read writes them out in standard ops (``qdeploy.graph.ml_ops``); each must compute what ONNX
Runtime computes for the original node."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import openvino as ov
import pytest
from onnx import TensorProto, helper, numpy_helper

from qdeploy.graph.ml_ops import lower_ml_ops
from qdeploy.targets.openvino_read import read_onnx

NAN = float("nan")


def _ml_model(op: str, attrs: dict[str, object], *, x_type: int = TensorProto.FLOAT, x_shape: list[int] | None = None,
              y_type: int = TensorProto.FLOAT, extra: list[onnx.TensorProto] | None = None,
              then_relu: bool = False) -> onnx.ModelProto:
    """One ml node reading ``x`` (a Relu after it when ``then_relu``: a network behind a scaler)."""
    nodes = [helper.make_node(op, ["x", *(t.name for t in extra or [])], ["y" if not then_relu else "ml"],
                              domain="ai.onnx.ml", name=f"{op.lower()}_node", **attrs)]
    if then_relu:
        nodes.append(helper.make_node("Relu", ["ml"], ["y"]))
    graph = helper.make_graph(nodes, op, [helper.make_tensor_value_info("x", x_type, x_shape or [3, 4])],
                              [helper.make_tensor_value_info("y", y_type, [None, None])], extra or [])
    opsets = [helper.make_opsetid("ai.onnx.ml", 3)] + ([helper.make_opsetid("", 17)] if then_relu else [])
    return helper.make_model(graph, opset_imports=opsets, ir_version=8)


def _x(x_type: int, shape: list[int], *, missing: bool) -> np.ndarray:
    """Inputs; ``missing``: NaN and -1 in places, an imputer's work (ORT's Binarizer refuses NaN, and a Relu of
    NaN is 0 on OpenVINO)."""
    rng = np.random.default_rng(0)
    values = rng.normal(size=shape) * 3
    if x_type == TensorProto.INT64:
        return values.round().astype(np.int64)
    values = values.astype(np.float32)
    if missing:
        values.flat[::5] = NAN
        values.flat[1::7] = -1.0
    return values


CASES = {
    "scaler per feature, then a network": (
        "Scaler", {"offset": [0.5, -1.0, 2.0, 0.0], "scale": [2.0, 0.5, 1.5, -1.0]}, {"then_relu": True}),
    "scaler of int64, one offset": (
        "Scaler", {"offset": [1.5], "scale": [0.25]}, {"x_type": TensorProto.INT64}),
    "binarizer": ("Binarizer", {"threshold": 0.5}, {}),
    "imputer of NaN per feature": (
        "Imputer", {"imputed_value_floats": [1.0, 2.0, 3.0, 4.0], "replaced_value_float": NAN}, {}),
    "imputer of -1": ("Imputer", {"imputed_value_floats": [9.0], "replaced_value_float": -1.0}, {}),
    "feature extractor, 2-D indices": (
        "ArrayFeatureExtractor", {}, {"extra": [numpy_helper.from_array(np.array([[3, 0], [1, 1]], np.int64), "i")]}),
    "feature extractor of a vector": (
        "ArrayFeatureExtractor", {}, {"x_shape": [5], "extra": [numpy_helper.from_array(np.array([4, 2]), "i")]}),
    "linear regressor, two targets": (
        "LinearRegressor", {"coefficients": [1.0, -2.0, 0.5, 0.0, 0.25, 1.0, -1.0, 3.0], "intercepts": [0.5, -2.0],
                            "targets": 2}, {}),
}


@pytest.mark.parametrize("case", CASES)
def test_openvino_reads_a_simple_ml_node_and_computes_what_onnx_runtime_computes(tmp_path: Path, case: str) -> None:
    op, attrs, options = CASES[case]
    model = _ml_model(op, attrs, **options)
    path = tmp_path / "model.onnx"
    onnx.save(model, path)
    x = _x(options.get("x_type", TensorProto.FLOAT), options.get("x_shape", [3, 4]), missing=op == "Imputer")
    expected = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    core = ov.Core()
    with pytest.raises(RuntimeError, match=f"ai.onnx.ml.{op}"):
        core.read_model(str(path))  # the frontend as it is: the reason for the rewrite
    read, notes = read_onnx(core, path)
    got = core.compile_model(read, "CPU", {"INFERENCE_PRECISION_HINT": "f32"})({"x": x})[0]
    assert notes and f"{op} '{op.lower()}_node'" in notes[0] and "ai.onnx.ml" in notes[0]
    assert got.shape == expected.shape and got.dtype == expected.dtype
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6, equal_nan=True)
    rewritten = onnx.load(path)
    assert lower_ml_ops(rewritten)
    onnx.checker.check_model(rewritten)  # the written-out graph is valid ONNX, not only to OpenVINO
    again = ort.InferenceSession(rewritten.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    np.testing.assert_array_equal(again[0], expected)  # the same computation, on ONNX Runtime too


@pytest.mark.parametrize(("op", "attrs", "y_type"), [
    ("LinearRegressor", {"coefficients": [1.0, 2.0, 3.0, 4.0], "post_transform": "PROBIT"}, TensorProto.FLOAT),
    ("TreeEnsembleRegressor", {"n_targets": 1, "nodes_featureids": [0], "nodes_modes": ["LEAF"], "nodes_nodeids": [0],
                               "nodes_treeids": [0], "nodes_values": [0.0], "nodes_truenodeids": [0],
                               "nodes_falsenodeids": [0], "target_ids": [0], "target_nodeids": [0],
                               "target_treeids": [0], "target_weights": [1.5]}, TensorProto.FLOAT),
    ("Binarizer", {"threshold": 0.5}, TensorProto.INT64),
])
def test_what_is_not_a_simple_computation_is_left_for_openvino_to_refuse(tmp_path: Path, op: str,
                                                                         attrs: dict[str, object],
                                                                         y_type: int) -> None:
    """A probit, a tree ensemble, an integer compared with a fractional threshold: not written out, and OpenVINO's
    own refusal names the operator."""
    model = _ml_model(op, attrs, x_type=TensorProto.INT64 if y_type == TensorProto.INT64 else TensorProto.FLOAT,
                      y_type=y_type)
    assert lower_ml_ops(model) == [] and [node.op_type for node in model.graph.node] == [op]
    onnx.save(model, tmp_path / "model.onnx")
    with pytest.raises(RuntimeError, match=f"ai.onnx.ml.{op}"):
        read_onnx(ov.Core(), tmp_path / "model.onnx")


BINARY = [-3.75, -0.017, -0.022, 0.43, 3.75, 0.017, 0.022, -0.43]  # skl2onnx's binary LogisticRegression: two rows
THREE = [-1.73, -2.23, 0.08, 0.26, -0.18, 0.18, 0.13, -0.07, 0.9, 0.4, -0.3, 0.2]


@pytest.mark.parametrize(("coefficients", "intercepts", "transform", "labels"), [
    (BINARY, [0.137, -0.137], "LOGISTIC", [0, 1]),
    (THREE, [-0.55, 1.59, -1.04], "SOFTMAX", [3, 7, 9]),
    (THREE, [-0.96, 0.10, -1.22], "NONE", [0, 1, 2]),
])
def test_a_linear_classifier_gives_openvino_the_labels_and_scores_onnx_runtime_gives(
        tmp_path: Path, coefficients: list[float], intercepts: list[float], transform: str, labels: list[int]) -> None:
    """scikit-learn's LogisticRegression and LinearSVC as skl2onnx writes them (zipmap off): a label per row
    and the scores, post-transformed."""
    node = helper.make_node("LinearClassifier", ["x"], ["label", "scores"], domain="ai.onnx.ml", name="classify",
                            coefficients=coefficients, intercepts=intercepts, classlabels_ints=labels,
                            post_transform=transform)
    graph = helper.make_graph([node], "classifier", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 4])],
                              [helper.make_tensor_value_info("label", TensorProto.INT64, [None]),
                               helper.make_tensor_value_info("scores", TensorProto.FLOAT, [None, len(labels)])])
    path = tmp_path / "model.onnx"
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.ml", 1)]
    onnx.save(helper.make_model(graph, opset_imports=opsets, ir_version=8), path)
    x = np.random.default_rng(3).normal(size=(64, 4)).astype(np.float32)
    label, scores = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    core = ov.Core()
    read, notes = read_onnx(core, path)
    got = core.compile_model(read, "CPU", {"INFERENCE_PRECISION_HINT": "f32"})({"x": x})
    assert "LinearClassifier 'classify'" in notes[0]
    np.testing.assert_array_equal(got[0], label)
    assert len(set(label.tolist())) > 1  # the labels differ between rows: the ArgMax is exercised
    np.testing.assert_allclose(got[1], scores, rtol=1e-5, atol=1e-6)
