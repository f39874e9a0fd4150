"""OpenVINO's placement (``runtime: openvino``) on a YOLOX-shaped graph: no requantization OpenVINO runs apart.

SiLU convolutions joined by a Concat, a MaxPool beside them (SPP), and a detection head whose Concat, Reshape and
Transpose lead to the output.  ONNX Runtime's placement requantizes every Concat input to the Concat's own range
(OpenVINO: one Convert-Subtract-FakeQuantize kernel per input, 33 on YOLOX) and quantizes the head's data movement
(the output on an 8-bit grid, no int8 kernel reading it); ``stages/quantize/ptq/_openvino.py`` gives a Concat's inputs
one range, removes the Q/DQ pairs that round nothing and leaves the tail float.
"""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from qdeploy.stages.quantize.ptq._openvino import drop_exact_requantization
from qdeploy.stages.quantize.ptq._prepare import prepare
from qdeploy.stages.quantize.ptq._ptq import BALANCED_OP_TYPES, EVERY_SIGNED, StaticBuilder, calibrate
from tests.helpers.quantize import init, make_model, run_ort

CHANNELS = 8


def _silu_conv(name: str, source: str, out_channels: int, in_channels: int, rng: np.random.Generator,
               kernel: int = 1) -> tuple[list[onnx.NodeProto], list[onnx.TensorProto]]:
    weight = rng.normal(0, 0.4, (out_channels, in_channels, kernel, kernel)).astype(np.float32)
    nodes = [helper.make_node("Conv", [source, f"{name}_w", f"{name}_b"], [f"{name}_c"], name=name,
                              pads=[kernel // 2] * 4),
             helper.make_node("Sigmoid", [f"{name}_c"], [f"{name}_s"], name=f"{name}_sig"),
             helper.make_node("Mul", [f"{name}_c", f"{name}_s"], [f"{name}_y"], name=f"{name}_mul")]
    return nodes, [init(f"{name}_w", weight), init(f"{name}_b", rng.normal(0, 0.2, out_channels))]


def yolox_like() -> onnx.ModelProto:
    """stem -> two SiLU branches (one 4x wider in range) -> Concat -> SPP (MaxPool, Concat) -> conv -> head."""
    rng = np.random.default_rng(0)
    nodes, inits = [], []
    for name, source, cin, kernel in (("stem", "x", 3, 3), ("left", "stem_y", CHANNELS, 1),
                                      ("right", "stem_y", CHANNELS, 3)):
        more, weights = _silu_conv(name, source, CHANNELS, cin, rng, kernel)
        nodes += more
        inits += weights
    inits[-2] = init("right_w", numpy_helper.to_array(inits[-2]) * 4)  # the branches' ranges differ
    nodes += [helper.make_node("Concat", ["left_y", "right_y"], ["csp"], name="csp_concat", axis=1),
              helper.make_node("MaxPool", ["csp"], ["pooled"], name="pool", kernel_shape=[3, 3], pads=[1] * 4),
              helper.make_node("Concat", ["csp", "pooled"], ["spp"], name="spp_concat", axis=1)]
    for name, source, cin in (("neck", "spp", 4 * CHANNELS),):
        more, weights = _silu_conv(name, source, CHANNELS, cin, rng, 3)
        nodes += more
        inits += weights
    # the head: box regression (wide range) beside a score (Sigmoid), concatenated, flattened, transposed
    inits += [init("box_w", rng.normal(0, 2, (4, CHANNELS, 1, 1))), init("box_b", np.zeros(4)),
              init("score_w", rng.normal(0, 0.3, (1, CHANNELS, 1, 1))), init("score_b", np.zeros(1)),
              init("shape", np.array([1, 5, -1]), np.int64)]
    nodes += [helper.make_node("Conv", ["neck_y", "box_w", "box_b"], ["box"], name="box_conv"),
              helper.make_node("Conv", ["neck_y", "score_w", "score_b"], ["score_c"], name="score_conv"),
              helper.make_node("Sigmoid", ["score_c"], ["score"], name="score_sig"),
              helper.make_node("Concat", ["box", "score"], ["head"], name="head_concat", axis=1),
              helper.make_node("Reshape", ["head", "shape"], ["flat"], name="head_reshape"),
              helper.make_node("Transpose", ["flat"], ["y"], name="head_transpose", perm=[0, 2, 1])]
    return make_model(nodes, inits, {"x": [1, 3, 16, 16]}, ["y"], opset=13)


def _calibrated(model: onnx.ModelProto, folder: Path, samples: list[dict[str, np.ndarray]],
                ) -> tuple[Path, dict[str, tuple[float, float]], list[str]]:
    """The prepared model, its calibrated ranges and the op types (the balanced set)."""
    source = folder / "model.onnx"
    onnx.save(model, str(source))
    prepared = prepare(source, folder).path
    op_types = list(BALANCED_OP_TYPES)
    ranges, _ = calibrate(prepared, op_types, lambda: iter(samples), folder, "minmax", 99.999)
    return prepared, ranges, op_types


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str | None, tuple[StaticBuilder, onnx.ModelProto]]:
    """Per runtime (None: ONNX Runtime's placement): the builder and its model with nothing kept float."""
    rng = np.random.default_rng(1)
    samples = [{"x": rng.uniform(0, 2, (1, 3, 16, 16)).astype(np.float32)} for _ in range(4)]
    prepared, ranges, op_types = _calibrated(yolox_like(), tmp_path_factory.mktemp("yolox_like"), samples)
    found = {}
    for runtime in (None, "openvino"):
        builder = StaticBuilder(prepared, ranges, [], per_channel=True, activation_type="uint8", weight_type="int8",
                                symmetric_activations=False, symmetric_weights=True, op_types=op_types,
                                runtime=runtime)
        found[runtime] = (builder, builder([]))
    return found


def _by_output(model: onnx.ModelProto) -> dict[str, onnx.NodeProto]:
    return {out: node for node in model.graph.node for out in node.output}


def _readers(model: onnx.ModelProto, tensor: str) -> list[str]:
    return [node.op_type for node in model.graph.node if tensor in node.input]


def _dequantization(model: onnx.ModelProto, tensor: str) -> tuple[float, int]:
    """The scale and zero point of the DequantizeLinear producing ``tensor`` (looked up through MaxPool)."""
    producers = _by_output(model)
    constants = {item.name: numpy_helper.to_array(item) for item in model.graph.initializer}
    node = producers[tensor]
    while node.op_type == "MaxPool":
        node = producers[node.input[0]]
    assert node.op_type == "DequantizeLinear", f"{tensor} comes from {node.op_type}"
    return float(constants[node.input[1]]), int(constants[node.input[2]])


def _concat(model: onnx.ModelProto, name: str) -> onnx.NodeProto:
    return next(node for node in model.graph.node if node.name == name)


def test_a_concats_inputs_share_one_grid_for_openvino(built: dict) -> None:
    def grids(runtime: str | None, name: str) -> set[tuple[float, int]]:
        model = built[runtime][0]._quantized  # before the exact pairs are dropped
        return {_dequantization(model, tensor) for tensor in _concat(model, name).input}

    assert len(grids(None, "csp_concat")) == 2  # ONNX Runtime's placement: each input its own range
    assert len(grids("openvino", "csp_concat")) == 1
    assert len(grids("openvino", "spp_concat")) == 1


def test_no_quantizelinear_after_a_concat_or_in_the_head_for_openvino(built: dict) -> None:
    ort_model, openvino_model = built[None][1], built["openvino"][1]
    for tensor in ("csp", "spp", "head", "flat"):
        assert "QuantizeLinear" not in _readers(openvino_model, tensor), tensor
    for tensor in ("csp", "spp"):
        assert "QuantizeLinear" in _readers(ort_model, tensor)  # ONNX Runtime's placement: unchanged
    # the head joins boxes (about +-30) and scores (0..1): one scale would leave the scores a few levels, so that
    # Concat stays float in ONNX Runtime's placement too (_mixed_concats), and the tail after it with it
    assert list(built[None][0].float_concats) == ["head_concat"]
    assert _by_output(openvino_model)["y"].op_type == "Transpose"  # the output is not on an 8-bit grid
    assert _by_output(ort_model)["y"].op_type == "Transpose"


def test_dropping_the_exact_pairs_changes_no_value(built: dict) -> None:
    """The Q/DQ pairs removed round nothing: ONNX Runtime computes the same outputs with and without them."""
    builder = built["openvino"][0]
    undropped = copy.deepcopy(builder._quantized)
    dropped = copy.deepcopy(undropped)
    assert drop_exact_requantization(dropped) >= 2
    feed = {"x": np.random.default_rng(2).uniform(0, 2, (1, 3, 16, 16)).astype(np.float32)}
    np.testing.assert_allclose(run_ort(dropped, feed)[0], run_ort(undropped, feed)[0], rtol=1e-6, atol=1e-6)


def test_openvino_still_runs_every_convolution_in_int8(built: dict, tmp_path: Path) -> None:
    """The convolutions reading a Concat or MaxPool without a Q/DQ in front: OpenVINO carries the
    dequantization through them (u8 convolutions, none left float)."""
    ov = pytest.importorskip("openvino")
    path = tmp_path / "openvino.onnx"
    onnx.save(built["openvino"][1], str(path))
    compiled = ov.Core().compile_model(str(path), "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    precisions = [str(op.get_rt_info()["runtimePrecision"].astype(str))
                  for op in compiled.get_runtime_model().get_ordered_ops()
                  if str(op.get_rt_info()["layerType"].astype(str)) == "Convolution"]
    assert len(precisions) == 6 and set(precisions) <= {"u8", "i8"}, precisions


def attention() -> onnx.ModelProto:
    """One attention head: q, k, v projections, scores = q k^T, softmax, context = p v, output projection."""
    rng = np.random.default_rng(3)
    width = 16
    inits = [init(f"{name}_w", rng.normal(0, 0.3, (width, width))) for name in ("q", "k", "v", "o")]
    nodes = [helper.make_node("MatMul", ["x", f"{name}_w"], [name], name=f"{name}_proj") for name in ("q", "k", "v")]
    nodes += [helper.make_node("Transpose", ["k"], ["kt"], name="k_transpose", perm=[0, 2, 1]),
              helper.make_node("MatMul", ["q", "kt"], ["scores"], name="scores"),
              helper.make_node("Softmax", ["scores"], ["probs"], name="softmax", axis=-1),
              helper.make_node("MatMul", ["probs", "v"], ["context"], name="context"),
              helper.make_node("MatMul", ["context", "o_w"], ["y"], name="o_proj")]
    return make_model(nodes, inits, {"x": [1, 8, width]}, ["y"], opset=13)


def test_attention_matmuls_stay_float_for_openvino(tmp_path: Path) -> None:
    """OpenVINO runs a MatMul of two activations float in its attention kernel: no Q/DQ in front of it for
    openvino (ONNX Runtime's placement keeps them: QLinearMatMul); the projections stay int8 on both."""
    rng = np.random.default_rng(4)
    samples = [{"x": rng.normal(0, 1, (1, 8, 16)).astype(np.float32)} for _ in range(4)]
    prepared, ranges, op_types = _calibrated(attention(), tmp_path, samples)
    for runtime, quantized in ((None, True), ("openvino", False)):
        model = StaticBuilder(prepared, ranges, [], per_channel=True, activation_type="uint8", weight_type="int8",
                              symmetric_activations=False, symmetric_weights=True, op_types=op_types,
                              runtime=runtime)([])
        producers = _by_output(model)
        nodes = {node.name: node for node in model.graph.node}
        for name in ("scores", "context"):
            fed = [producers[tensor].op_type == "DequantizeLinear" for tensor in nodes[name].input
                   if tensor in producers]
            assert fed and all(fed) is quantized and any(fed) is quantized, (runtime, name, fed)
        for name in ("q_proj", "o_proj"):
            assert producers[nodes[name].input[0]].op_type == "DequantizeLinear", (runtime, name)


def resnet_stem() -> onnx.ModelProto:
    """Conv -> Relu -> MaxPool -> Conv -> Relu, as ResNet's stem: nothing quantizes the MaxPool's input for ORT."""
    rng = np.random.default_rng(5)
    inits = [init("w1", rng.normal(0, 0.3, (CHANNELS, 3, 3, 3))), init("b1", rng.normal(0, 0.1, CHANNELS)),
             init("w2", rng.normal(0, 0.3, (CHANNELS, CHANNELS, 3, 3))), init("b2", np.zeros(CHANNELS))]
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="conv1", pads=[1] * 4),
             helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
             helper.make_node("MaxPool", ["r1"], ["p"], name="pool", kernel_shape=[3, 3], strides=[2, 2], pads=[1] * 4),
             helper.make_node("Conv", ["p", "w2", "b2"], ["c2"], name="conv2", pads=[1] * 4),
             helper.make_node("Relu", ["c2"], ["y"], name="relu2")]
    return make_model(nodes, inits, {"x": [1, 3, 16, 16]}, ["y"], opset=13)


def test_a_maxpool_after_a_convolution_reads_quantized_values_for_openvino(tmp_path: Path) -> None:
    """OpenVINO's placement leaves the Conv's output float (its Relu fuses into the int8 Conv), so ORT's rule
    (quantize a MaxPool only where its input is quantized) would put the Q after the MaxPool: OpenVINO then runs a
    bf16/f32 MaxPool and a FakeQuantize kernel.  The Relu's output is quantized in front of it instead, with no pair
    after it, and OpenVINO runs the MaxPool in int8.  The signed input is int8 with zero point 0 for OpenVINO."""
    rng = np.random.default_rng(6)
    samples = [{"x": rng.normal(0, 1, (1, 3, 16, 16)).astype(np.float32)} for _ in range(4)]
    prepared, ranges, op_types = _calibrated(resnet_stem(), tmp_path, samples)
    source = tmp_path / "model.onnx"
    models = {runtime: StaticBuilder(prepared, ranges, [], per_channel=True, activation_type="uint8",
                                     weight_type="int8", symmetric_activations=False, symmetric_weights=True,
                                     op_types=op_types, runtime=runtime,
                                     signed_int8=EVERY_SIGNED if runtime == "openvino" else 0.0)([])
              for runtime in (None, "openvino")}
    ort_model, openvino_model = models[None], models["openvino"]
    assert "QuantizeLinear" in _readers(ort_model, "p")  # ORT: QLinearConv -> MaxPool -> Q, unchanged
    pool = _concat(openvino_model, "pool")
    assert _by_output(openvino_model)["r1"].op_type == "Relu"
    assert _by_output(openvino_model)[pool.input[0]].op_type == "DequantizeLinear"
    assert _readers(openvino_model, "p") == ["Conv"]  # the pair after it rounded nothing
    assert _dequantization(openvino_model, "p")[1] == 0  # a Relu's output: uint8, zero point 0
    input_zero_point = next(item for item in openvino_model.graph.initializer
                            if item.name == next(node for node in openvino_model.graph.node
                                                 if node.op_type == "QuantizeLinear" and node.input[0] == "x").input[2])
    assert input_zero_point.data_type == onnx.TensorProto.INT8 and int(numpy_helper.to_array(input_zero_point)) == 0
    feed = samples[0]
    reference = run_ort(source, feed)[0]
    for model in models.values():  # both graphs stay close to float32 on ONNX Runtime
        got = run_ort(model, feed)[0]
        assert float(np.dot(got.ravel(), reference.ravel()) / np.linalg.norm(got) / np.linalg.norm(reference)) > 0.99
    ov = pytest.importorskip("openvino")
    path = tmp_path / "openvino.onnx"
    onnx.save(openvino_model, str(path))
    compiled = ov.Core().compile_model(str(path), "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    layers = {str(op.get_rt_info()["layerType"].astype(str)): str(op.get_rt_info()["runtimePrecision"].astype(str))
              for op in compiled.get_runtime_model().get_ordered_ops()}
    assert layers["Pooling" if "Pooling" in layers else "MaxPool"] in {"u8", "i8"}, layers
