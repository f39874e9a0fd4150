"""A YOLOv8-style head of dynamic height and width: its anchor grid, computed from the input's shape, is never
quantized; where OpenVINO runs the graph, the head's float Concat reads its convolutions' float outputs; and
OpenVINO's build leaves a Concat that reaches compute only through a float Softmax float (nudenet 320n,
docs/measurements/2026-12-04-yolov8-dynamic-head.md)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import helper

from qdeploy.graph.shape_values import shape_computed, shape_computed_nodes
from qdeploy.stages.quantize.ptq._openvino import float_tail
from qdeploy.stages.quantize.ptq._ptq import BALANCED_OP_TYPES
from tests.helpers.quantize import init, make_model, openvino_agrees_with_ort, producers, static_builder

GRID = {"n", "grid_x", "grid_y_half", "grid_y", "grid"}
"""The tensors of the head computed from the input's shape: positions 0 .. N-1 and N/2 offsets, as YOLOv8's
anchor points are."""


def detection_head() -> onnx.ModelProto:
    """x [1, 4, h, w] -> box (2) and class (3) convolutions -> Concat -> Reshape [1, 5, h*w] -> Split; boxes: a
    float Softmax plus an anchor grid built from Shape -> Range (h and w symbolic); scores: Sigmoid; -> Concat."""
    rng = np.random.default_rng(0)
    nodes = [
        helper.make_node("Conv", ["x", "wb"], ["box"], name="box_conv", pads=[1, 1, 1, 1]),
        helper.make_node("Conv", ["x", "wc", "bc"], ["cls"], name="cls_conv", pads=[1, 1, 1, 1]),
        helper.make_node("Concat", ["box", "cls"], ["cat"], name="head_concat", axis=1),
        helper.make_node("Reshape", ["cat", "flat_shape"], ["flat"], name="flatten"),
        helper.make_node("Split", ["flat", "parts"], ["b", "c"], name="split", axis=1),
        helper.make_node("Softmax", ["b"], ["probs"], name="dfl", axis=1),
        helper.make_node("Shape", ["flat"], ["shape"], name="shape"),
        helper.make_node("Gather", ["shape", "two"], ["n_int"], name="count", axis=0),
        helper.make_node("Cast", ["n_int"], ["n"], name="to_float", to=onnx.TensorProto.FLOAT),
        helper.make_node("Range", ["zero", "n", "one"], ["positions"], name="range"),
        helper.make_node("Unsqueeze", ["positions", "axes0"], ["grid_x"], name="grid_x"),
        helper.make_node("Mul", ["positions", "half"], ["grid_y_half"], name="half"),
        helper.make_node("Unsqueeze", ["grid_y_half", "axes0"], ["grid_y"], name="grid_y"),
        helper.make_node("Concat", ["grid_x", "grid_y"], ["grid"], name="grid", axis=0),
        helper.make_node("Add", ["probs", "grid"], ["boxes"], name="decode"),
        helper.make_node("Sigmoid", ["c"], ["scores"], name="scores"),
        helper.make_node("Concat", ["boxes", "scores"], ["y"], name="output_concat", axis=1),
    ]
    inits = [init("wb", rng.standard_normal((2, 4, 3, 3)) * 0.5), init("wc", rng.standard_normal((3, 4, 3, 3)) * 0.3),
             init("bc", [-4.0, -6.0, -5.0]),  # class logits mostly negative: their range's zero point near 255
             init("flat_shape", [1, 5, -1], np.int64), init("parts", [2, 3], np.int64), init("two", 2, np.int64),
             init("zero", 0.0), init("one", 1.0), init("half", 0.5), init("axes0", [0], np.int64)]
    model = make_model(nodes, inits, {"x": [1, 4, 8, 8]}, ["y"])
    for dim, name in zip(model.graph.input[0].type.tensor_type.shape.dim[2:], ("h", "w"), strict=True):
        dim.dim_param = name
    return model


def _samples(count: int = 4) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(3)
    return [{"x": rng.uniform(-2, 2, (1, 4, 8, 8)).astype(np.float32)} for _ in range(count)]


def test_the_anchor_grid_is_found_as_computed_from_shapes_and_the_data_is_not() -> None:
    model = detection_head()
    found = shape_computed(model.graph)
    assert found >= GRID | {"positions", "shape", "n_int"}
    assert not found & {"box", "cls", "cat", "flat", "b", "probs", "boxes", "y"}
    nodes = set(shape_computed_nodes(onnx.shape_inference.infer_shapes(model)))
    # the float grid's producers and its data reader; the integer Shape -> Gather steps need no exclusion
    assert {"to_float", "range", "grid_x", "half", "grid_y", "grid", "decode"} <= nodes
    assert not nodes & {"shape", "count", "box_conv", "head_concat", "output_concat"}


def test_no_quantizer_pair_reads_the_anchor_grid(tmp_path: Path) -> None:
    """ORT's quantizer quantized the grid's Unsqueeze outputs and Concat like activations (positions 0 .. N-1 on
    256 levels) in a graph ONNX Runtime runs; the build leaves every shape-computed tensor float."""
    builder, _ = static_builder(tmp_path, detection_head(), _samples(), openvino_runs=False)
    model = builder([])
    read = {node.input[0] for node in model.graph.node if node.op_type == "QuantizeLinear"}
    assert not read & (GRID | {"positions"}), read
    assert {"x", "box", "cls"} <= read  # the convolutions and the head's Concat are still quantized
    assert "range" in builder.shape_computed


def test_where_openvino_runs_the_graph_the_float_head_concat_reads_the_convolutions_float_outputs(
        tmp_path: Path) -> None:
    """The budget keeps the head's Reshape float (as it kept nudenet's neighbouring Concats): the Concat's output
    pair then has no reader left, and the Concat runs float between quantized convolutions."""
    builder, _ = static_builder(tmp_path, detection_head(), _samples(), openvino_runs=True)
    model = builder(["flatten"])
    concat = next(node for node in model.graph.node if node.name == "head_concat")
    made_by = producers(model)
    assert [made_by[name].op_type for name in concat.input] == ["Conv", "Conv"], list(concat.input)
    assert openvino_agrees_with_ort(model, _samples(1)[0]) > 0.999


def test_a_graph_only_onnx_runtime_runs_keeps_its_quantized_convolution_outputs(tmp_path: Path) -> None:
    """ONNX Runtime needs the pair after a Conv to run it as QLinearConv: only OpenVINO's graphs lose it."""
    builder, _ = static_builder(tmp_path, detection_head(), _samples(), openvino_runs=False)
    model = builder(["flatten"])
    concat = next(node for node in model.graph.node if node.name == "head_concat")
    made_by = producers(model)
    assert {made_by[name].op_type for name in concat.input} == {"DequantizeLinear"}


def test_openvino_leaves_a_concat_that_reaches_compute_only_through_a_float_softmax_float() -> None:
    """box and class convolutions -> Concat -> Softmax (float) -> Conv: nothing int8 reads the Concat."""
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("Conv", ["x", "w1"], ["a"], name="c1"),
             helper.make_node("Conv", ["x", "w2"], ["b"], name="c2"),
             helper.make_node("Concat", ["a", "b"], ["cat"], name="cat", axis=1),
             helper.make_node("Softmax", ["cat"], ["p"], name="softmax", axis=1),
             helper.make_node("Conv", ["p", "w3"], ["y"], name="c3")]
    weights = [init(name, rng.standard_normal(shape)) for name, shape in
               (("w1", (4, 4, 1, 1)), ("w2", (4, 4, 1, 1)), ("w3", (1, 8, 1, 1)))]
    model = make_model(nodes, weights, {"x": [1, 4, 6, 6]}, ["y"])
    assert "cat" in float_tail(model, list(BALANCED_OP_TYPES))
