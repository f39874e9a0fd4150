"""The per-layer profile: ORT kernels and OpenVINO layers mapped back to the ONNX nodes they compute, with the
precision that ran (issue 31)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper

from qdeploy.targets.layer_profile import (
    LayerTime,
    NodeIndex,
    complete_groups,
    exec_precision,
    ort_kernel_precision,
    ort_node_of,
    profile_layers,
)
from tests.helpers.layers import conv_bn_relu
from tests.helpers.models import tiny_cnn

FEEDS = {"input": np.random.default_rng(0).random((1, 3, 16, 16), dtype=np.float32)}


@pytest.fixture(scope="module")
def fused_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("layers") / "fused.onnx"
    onnx.save(conv_bn_relu(), path)
    return path


@pytest.fixture(scope="module")
def int8_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tiny_cnn quantized by ONNX Runtime's static QDQ quantizer (uint8 activations, int8 weights)."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    folder = tmp_path_factory.mktemp("layers-int8")
    onnx.save(tiny_cnn(), folder / "float.onnx")

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            rng = np.random.default_rng(1)
            self.feeds = iter([{"input": rng.random((1, 3, 16, 16), dtype=np.float32)} for _ in range(4)])

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self.feeds, None)

    quantize_static(str(folder / "float.onnx"), str(folder / "int8.onnx"), Reader(), quant_format=QuantFormat.QDQ,
                    activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)
    return folder / "int8.onnx"


def test_openvino_layer_of_a_fused_conv_bn_relu_maps_to_all_three_nodes(fused_path: Path) -> None:
    """OpenVINO fuses Conv+BatchNormalization+Relu into one Convolution layer whose originalLayersNames name the
    BatchNormalization and the Relu only (the Conv went into an OpenVINO-made Multiply): the group holds all three,
    the Conv added through the graph and said so."""
    layers = profile_layers(fused_path, "openvino:cpu", FEEDS, runs=2).layers
    conv = [layer for layer in layers if layer.op == "Convolution"]
    assert len(conv) == 1 and conv[0].nodes == ["conv", "bn", "relu"] and conv[0].precision == "f32"
    assert set(conv[0].through_graph) <= {"conv"}
    assert sum("conv" in layer.nodes for layer in layers) == 1  # one layer claims it: never split by guess


def test_ort_kernel_of_a_fused_conv_bn_relu_is_one_group(fused_path: Path) -> None:
    layers = profile_layers(fused_path, "ort:cpu", FEEDS, runs=2).layers
    conv = [layer for layer in layers if layer.op == "Conv"]
    assert len(conv) == 1 and conv[0].nodes == ["conv", "bn", "relu"]
    gaps = [layer for layer in layers if not layer.nodes]
    assert all(layer.op.startswith("Reorder") or layer.op == "Transpose" for layer in gaps)
    assert all(layer.time_ms >= 0 for layer in layers)


def test_int8_build_shows_int8_exec_types_on_openvino(int8_path: Path) -> None:
    layers = profile_layers(int8_path, "openvino:cpu", FEEDS, runs=2, pin_f32=False).layers
    conv = next(layer for layer in layers if layer.op == "Convolution")
    assert conv.precision == "int8" and conv.exec.upper().endswith(("I8", "U8")), conv
    assert "conv" in conv.nodes


def test_int8_build_runs_qlinearconv_on_ort(int8_path: Path) -> None:
    layers = profile_layers(int8_path, "ort:cpu", FEEDS, runs=2, pin_f32=False).layers
    conv = next(layer for layer in layers if "conv" in layer.nodes and layer.op != "DequantizeLinear")
    assert (conv.op, conv.precision) == ("QLinearConv", "int8")


def test_kernel_names_and_types_read_as_precisions() -> None:
    names = {"conv": "conv", "relu": "relu", "#conv": "Conv"}
    assert ort_node_of("conv_token_2", names) == "conv" and ort_node_of("relu_nchwc", names) == "relu"
    assert ort_node_of("InsertedPrecisionFreeCast_relu_nchwc", names) == "relu"
    assert ort_node_of("Transpose_token_0", names) is None and ort_node_of("#conv", names) is None
    assert ort_kernel_precision("QLinearConv", ["uint8"]) == "int8"
    assert ort_kernel_precision("DequantizeLinear", ["int8"]) == "q/dq"
    assert ort_kernel_precision("Conv", ["float16"]) == "f16" and ort_kernel_precision("Conv", ["float"]) == "f32"
    assert [exec_precision(e) for e in ("brgconv_avx512_I8", "jit_avx512_bf16", "gemm_mlas_f32", "undef")] == \
        ["int8", "bf16", "f32", "?"]


def test_weights_held_as_constant_nodes_do_not_hide_a_folded_conv(tmp_path: Path) -> None:
    """Exported graphs (PP-OCRv4 rec) hold weights as Constant nodes: they are no producers, so the Conv that
    OpenVINO folded into a layer named after what followed it is still found; ORT's ``node/...Fusion/`` kernels
    map to their node."""
    model = conv_bn_relu()
    constants = [helper.make_node("Constant", [], [tensor.name], value=tensor) for tensor in model.graph.initializer]
    nodes = [*constants, *model.graph.node]
    del model.graph.initializer[:], model.graph.node[:]
    model.graph.node.extend(nodes)
    onnx.save(model, tmp_path / "constants.onnx")
    graph = NodeIndex.of(tmp_path / "constants.onnx")
    layers = [LayerTime("Multiply_1", "Convolution", "jit_avx512_f32", "f32", 1.0, ["bn", "relu"])]
    complete_groups(layers, graph)
    assert layers[0].nodes == ["conv", "bn", "relu"] and layers[0].through_graph == ["conv"]
    assert ort_node_of("conv/MatmulTransposeFusion/", graph.names) == "conv"
