"""ONNX Runtime's fused ops in a model it saved optimized (ORT_ENABLE_EXTENDED) are written back as standard ops at
intake (``stages/export/_unfuse.py``): before, int8's quantizers did not know FusedConv, its input stayed float and
the OpenVINO build came out as a weight-only model."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from qdeploy.pipeline.recipe.schema import Recipe
from qdeploy.stages import export
from tests.helpers.models import write_recipe

RNG = np.random.default_rng(0)


def _weights() -> list[onnx.TensorProto]:
    arrays = {"w": RNG.standard_normal((4, 3, 3, 3)) / 3, "b": RNG.standard_normal(4) / 5,
              "w2": RNG.standard_normal((4, 4, 3, 3)) / 3, "g": RNG.standard_normal((64, 10)) / 8,
              "gb": RNG.standard_normal(10) / 5, "m": RNG.standard_normal((10, 6)) / 3,
              "m2": RNG.standard_normal((6, 10)) / 3}
    return [numpy_helper.from_array(value.astype(np.float32), name) for name, value in arrays.items()]


def fused_model() -> onnx.ModelProto:
    """FusedConv(LeakyRelu 0.2) -> FusedConv(no bias, residual Z, Relu) -> Flatten -> FusedGemm(HardSigmoid) ->
    FusedMatMul(alpha 0.5) -> y; a FusedMatMul with transB (a form this module does not write) -> z; a
    FusedConv clipped to [0, 0.3] -> six."""
    ms = "com.microsoft"
    nodes = [helper.make_node("FusedConv", ["x", "w", "b"], ["a"], name="c1", domain=ms, pads=[1, 1, 1, 1],
                              activation="LeakyRelu", activation_params=[0.2]),
             helper.make_node("FusedConv", ["a", "w2", "", "a"], ["r"], name="c2", domain=ms, pads=[1, 1, 1, 1],
                              activation="Relu"),
             helper.make_node("Flatten", ["r"], ["f"], name="flat"),
             helper.make_node("FusedGemm", ["f", "g", "gb"], ["h"], name="fc", domain=ms, activation="HardSigmoid",
                              activation_alpha=0.2, activation_beta=0.5),
             helper.make_node("FusedMatMul", ["h", "m"], ["y"], name="mm", domain=ms, alpha=0.5),
             helper.make_node("FusedMatMul", ["h", "m2"], ["z"], name="mm_t", domain=ms, transB=1),
             helper.make_node("FusedConv", ["x", "w", "b"], ["six"], name="c6", domain=ms, pads=[1, 1, 1, 1],
                              activation="Clip", activation_params=[0.0, 0.3])]
    graph = helper.make_graph(nodes, "fused", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 4, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 6]),
                               helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, 6]),
                               helper.make_tensor_value_info("six", TensorProto.FLOAT, [1, 4, 4, 4])], _weights())
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(ms, 1)],
                             ir_version=8)


def _export(tmp_path: Path, source: Path) -> export.StageResult:
    recipe = Recipe.model_validate({"name": "t", "model": {"onnx": str(source)}, "variants": {"fp32": []}})
    write_recipe(tmp_path, "name: t\nmodel: {onnx: m.onnx}\nvariants: {fp32: []}\n")
    from tests.helpers.fp16 import context

    return export.run(None, recipe.model, context(tmp_path))


def _run(model: onnx.ModelProto | str, x: np.ndarray) -> list[np.ndarray]:
    source = model if isinstance(model, str) else model.SerializeToString()
    return ort.InferenceSession(source, providers=["CPUExecutionProvider"]).run(None, {"x": x})


def test_fused_ops_become_the_standard_ops_they_fuse(tmp_path: Path) -> None:
    onnx.save(fused_model(), tmp_path / "m.onnx")
    result = _export(tmp_path, tmp_path / "m.onnx")
    assert result.findings.runtime_fusions_undone == {"FusedConv": 3, "FusedGemm": 1, "FusedMatMul": 1}
    ops = [(node.domain, node.op_type) for node in result.model.graph.node]
    assert ops.count(("", "Conv")) == 3 and ("", "Clip") in ops and ("", "Gemm") in ops and ("", "MatMul") in ops
    assert [op for domain, op in ops if domain] == ["FusedMatMul"]  # the transposing one stays
    x = RNG.standard_normal((1, 3, 4, 4)).astype(np.float32)
    for got, expected in zip(_run(result.model, x), _run(str(tmp_path / "m.onnx"), x), strict=True):
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


def test_a_model_onnx_runtime_saved_at_extended_level_comes_back_standard(tmp_path: Path) -> None:
    weight = numpy_helper.from_array(RNG.standard_normal((8, 3, 3, 3)).astype(np.float32), "w")
    graph = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
                               helper.make_node("Relu", ["c"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 4, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 4, 4])], [weight])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), tmp_path / "s.onnx")
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    options.optimized_model_filepath = str(tmp_path / "m.onnx")
    ort.InferenceSession(str(tmp_path / "s.onnx"), options, providers=["CPUExecutionProvider"])
    assert [node.op_type for node in onnx.load(tmp_path / "m.onnx").graph.node] == ["FusedConv"]
    result = _export(tmp_path, tmp_path / "m.onnx")
    assert [node.op_type for node in result.model.graph.node] == ["Conv", "Relu"]
