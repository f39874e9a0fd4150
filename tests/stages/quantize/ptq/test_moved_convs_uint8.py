"""Int8 activation pairs whose value reaches a convolution through data movement (Reshape, Transpose, MaxPool...),
with a Concat after the convolution, moved to uint8 where OpenVINO runs the graph (``ptq._concat_uint8``):
OpenVINO 2026.4's CPU plugin computed such a graph wrongly (basic-pitch's constant-Q transform; a four-node
reproducer, ``benchmarks/openvino_moved_convs.py``).  The rewrite is exact on ONNX Runtime; OpenVINO then agrees."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from qdeploy.stages import quantize
from qdeploy.stages.quantize import QuantizeConfig
from qdeploy.stages.quantize.ptq._concat_uint8 import uint8_before_moved_convs
from tests.helpers.quantize import (
    cosine,
    init,
    make_model,
    openvino_agrees_with_ort,
    run_ort,
    save_artifact,
    stage_context,
)

WIDTH = 96


def qdq_graph(mover: str | None = "Reshape", concat: bool = True, group: int = 1) -> onnx.ModelProto:
    """x [1, 1, W] -> int8 pair (zero point 0) -> ``mover`` -> Conv (int8 weights) -> Concat([y, y]); ``group`` 4
    reshapes to 4 channels and convolves depthwise."""
    rng = np.random.default_rng(0)
    weights = rng.normal(0, 0.3, (4, 1, 1, 8)).astype(np.float32)  # one input channel: also depthwise at group 4
    scales = (np.abs(weights).reshape(4, -1).max(1) / 127).astype(np.float32)
    inits = [numpy_helper.from_array(np.array(0.01, np.float32), "s"),
             numpy_helper.from_array(np.array(0, np.int8), "z"),
             numpy_helper.from_array(np.round(weights / scales[:, None, None, None]).astype(np.int8), "wq"),
             numpy_helper.from_array(scales, "ws"), numpy_helper.from_array(np.zeros(4, np.int8), "wz"),
             numpy_helper.from_array(np.array([1, group, 1, WIDTH // group], np.int64), "shape")]
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"]),
             helper.make_node("DequantizeLinear", ["q", "s", "z"], ["d"]),
             helper.make_node("DequantizeLinear", ["wq", "ws", "wz"], ["w"], axis=0),
             helper.make_node("Conv", ["r" if mover else "d", "w"], ["y"], kernel_shape=[1, 8], group=group)]
    if mover:
        nodes.insert(2, helper.make_node(mover, ["d", "shape"], ["r"]))
    if concat:
        nodes.append(helper.make_node("Concat", ["y", "y"], ["out"], axis=1))
    shape = [1, 1, WIDTH] if mover else [1, 1, 1, WIDTH]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("out" if concat else "y", TensorProto.FLOAT,
                                                             [1, 8 if concat else 4, 1, WIDTH // group - 7])],
                              inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _feed(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    shape = [dim.dim_value for dim in model.graph.input[0].type.tensor_type.shape.dim]
    return {"x": (0.6 * np.sin(np.arange(WIDTH) / 5.0)).astype(np.float32).reshape(shape)}


def test_a_pair_reaching_a_convolution_through_a_reshape_moves_to_uint8_exactly() -> None:
    model = qdq_graph()
    before = run_ort(model, _feed(model))
    assert uint8_before_moved_convs(model) == 1
    assert uint8_before_moved_convs(model) == 0  # nothing int8 is left there
    zero_points = {init.name: init.data_type for init in model.graph.initializer}
    assert zero_points[model.graph.node[0].input[2]] == TensorProto.UINT8
    onnx.checker.check_model(model)
    np.testing.assert_array_equal(run_ort(model, _feed(model))[0], before[0])
    assert openvino_agrees_with_ort(model, _feed(model)) > 0.999


@pytest.mark.parametrize(("mover", "concat", "group"), [(None, True, 1), ("Reshape", False, 1), ("Reshape", True, 4)])
def test_a_pair_read_straight_without_a_concat_after_or_by_a_depthwise_conv_stays_int8(
        mover: str | None, concat: bool, group: int) -> None:
    """The forms OpenVINO computed right on a VNNI CPU (the reproducer's controls) keep their faster int8 input."""
    assert uint8_before_moved_convs(qdq_graph(mover, concat, group)) == 0


def _float_model() -> onnx.ModelProto:
    """x [1, 1, W] (a signed, centred signal) -> reflect Pad -> Unsqueeze -> Conv (a tf2onnx Conv1D) -> Relu; a
    Concat of the Relu and of a second Conv."""
    rng = np.random.default_rng(2)
    nodes = [helper.make_node("Pad", ["x", "pads"], ["p"], mode="reflect", name="pad"),
             helper.make_node("Unsqueeze", ["p", "axes"], ["u"], name="unsqueeze"),
             helper.make_node("Conv", ["u", "w1"], ["a"], kernel_shape=[1, 8], name="conv1"),
             helper.make_node("Relu", ["a"], ["b"], name="relu"),
             helper.make_node("Conv", ["b", "w2"], ["c"], kernel_shape=[1, 1], name="conv2"),
             helper.make_node("Concat", ["b", "c"], ["y"], axis=1, name="cat")]
    weights = [init("w1", rng.normal(0, 0.3, (4, 1, 1, 8))), init("w2", rng.normal(0, 0.3, (4, 4, 1, 1))),
               init("pads", [0, 0, 4, 0, 0, 3], np.int64), init("axes", [2], np.int64)]
    return make_model(nodes, weights, {"x": [1, 1, WIDTH]}, {"y": [1, 8, 1, WIDTH]})


@pytest.mark.parametrize("targets", [("openvino:cpu",), ("ort:cpu",)])
def test_the_openvino_graph_keeps_such_pairs_off_int8_and_says_so(tmp_path: Path, targets: tuple[str, ...]) -> None:
    runtime = "openvino" if targets == ("openvino:cpu",) else "ort"
    context = dataclasses.replace(stage_context(tmp_path, ranges={"x": (-0.6, 0.6)}), variant=f"int8@{runtime}",
                                  targets=targets)
    config = QuantizeConfig(mode="ptq", activation_type="int8", runtime=runtime, calibration={"samples": 4})
    result = quantize.run(save_artifact(tmp_path, _float_model()), config, context)
    types = {init.name: init.data_type for init in result.model.graph.initializer}
    at_input = [types[node.input[2]] for node in result.model.graph.node
                if node.op_type == "QuantizeLinear" and node.input[0] == "p"]
    note = result.report()["signed_activations"].get("uint8_before_moved_convs", "")
    if runtime == "openvino":
        assert at_input == [TensorProto.UINT8] and note.startswith("1 int8 activation pairs"), (at_input, note)
        feed = _feed(_float_model())
        assert cosine(run_ort(result.model, feed)[0], run_ort(_float_model(), feed)[0]) > 0.99
        assert openvino_agrees_with_ort(result.model, feed) > 0.999
    else:  # ONNX Runtime computes the int8 input right: it keeps it
        assert at_input == [TensorProto.INT8] and not note
