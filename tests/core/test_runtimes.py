"""Row names that run another row's artifact at another precision setting (``fp32@default``, ``int4@f32``), and
what makes an artifact weight-only (qdeploy/core/runtimes.py, qdeploy/core/context.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from qdeploy.core.context import weight_only_graph
from qdeploy.core.runtimes import artifact_of, built_for, pinned_f32_name, runtime_of_variant, setting_of


def test_setting_rows_name_their_artifact_and_run_on_openvino_only() -> None:
    assert pinned_f32_name("int4") == "int4@f32" and setting_of("int4@f32") == "f32"
    assert setting_of("fp32@default") == "default" and setting_of("int8@openvino") is None
    assert artifact_of("int4@f32") == "int4" and artifact_of("int8@openvino@f32") == "int8@openvino"
    assert runtime_of_variant("int8@openvino@f32") == "openvino" and runtime_of_variant("int4@f32") is None
    assert built_for("int4@f32", "openvino:cpu") and not built_for("int4@f32", "ort:cpu")
    assert built_for("int8@openvino@f32", "openvino:gpu") and not built_for("int8@ort@f32", "openvino:cpu")
    assert built_for("int8@ort", "ort:cpu") and not built_for("int8@ort", "openvino:cpu")


def _save(tmp_path: Path, name: str, nodes: list[onnx.NodeProto], initializers: list[onnx.TensorProto]) -> Path:
    graph = helper.make_graph(nodes, name, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])], initializers)
    path = tmp_path / f"{name}.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)]), str(path))
    return path


def test_weight_only_means_quantized_weights_and_float_activations(tmp_path: Path) -> None:
    weight = numpy_helper.from_array(np.ones((4, 4), np.int8), "wq")
    scale = numpy_helper.from_array(np.array(0.1, np.float32), "s")
    zero = numpy_helper.from_array(np.array(0, np.int8), "z")
    dq_weight = helper.make_node("DequantizeLinear", ["wq", "s", "z"], ["w"])
    weights_only = _save(tmp_path, "wo", [dq_weight, helper.make_node("MatMul", ["x", "w"], ["y"])],
                         [weight, scale, zero])
    qdq = _save(tmp_path, "qdq", [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["xq"]),
                                  helper.make_node("DequantizeLinear", ["xq", "s", "z"], ["xd"]), dq_weight,
                                  helper.make_node("MatMul", ["xd", "w"], ["y"])], [weight, scale, zero])
    plain = _save(tmp_path, "plain", [helper.make_node("Relu", ["x"], ["y"])], [])
    assert weight_only_graph(weights_only)
    assert not weight_only_graph(qdq)  # activations quantized too
    assert not weight_only_graph(plain)  # nothing quantized
