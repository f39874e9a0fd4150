"""A float16 source model quantized to int8 (``_prepare._float32_inside``): ONNX Runtime's quantizer wrote its
weights' scales in float16, which DequantizeLinear refuses below opset 19, and the artifact could not be loaded
(an ONNX Runtime-optimized BERT converted to float16 by onnxruntime.transformers)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from qdeploy.stages import quantize
from qdeploy.stages.quantize import QuantizeConfig
from tests.helpers.quantize import cosine, run_ort, save_artifact, stage_context

ROWS, WIDTH = 512, 64


def half_model() -> onnx.ModelProto:
    """ids -> Gather(float16 table) + x (float16 input) -> MatMul(float16 weight) + bias -> Relu -> float16 y."""
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("Gather", ["table", "ids"], ["rows"], name="embed"),
             helper.make_node("Add", ["rows", "x"], ["h"], name="mix"),
             helper.make_node("MatMul", ["h", "w"], ["m"], name="proj"),
             helper.make_node("Add", ["m", "bias"], ["s"], name="bias_add"),
             helper.make_node("Relu", ["s"], ["y"], name="relu")]
    weights = [numpy_helper.from_array(rng.standard_normal((ROWS, WIDTH)).astype(np.float16), "table"),
               numpy_helper.from_array((rng.standard_normal((WIDTH, WIDTH)) / 8).astype(np.float16), "w"),
               numpy_helper.from_array(rng.standard_normal(WIDTH).astype(np.float16) / 4, "bias")]
    graph = helper.make_graph(nodes, "half", [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, 8]),
                                              helper.make_tensor_value_info("x", TensorProto.FLOAT16, [1, 8, WIDTH])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT16, [1, 8, WIDTH])], weights)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


FEED = {"ids": np.random.default_rng(1).integers(0, ROWS, (1, 8)),
        "x": np.random.default_rng(2).uniform(-1, 1, (1, 8, WIDTH)).astype(np.float16)}


def _quantize(tmp_path: Path, mode: str, excluded: list[str]) -> tuple[onnx.ModelProto, dict[str, object]]:
    context = dataclasses.replace(stage_context(tmp_path, ranges={"x": (-1.0, 1.0), "ids": (0, ROWS - 1)}),
                                  variant="int8", targets=("ort:cpu",))
    engine = {"engine": "nncf"} if mode == "nncf" else {}
    config = QuantizeConfig(mode="ptq" if engine else mode, exclude_op_types=excluded, **engine)
    result = quantize.run(save_artifact(tmp_path, half_model()), config, context)
    return result.model, result.findings.model_dump()


def _matches_source(model: onnx.ModelProto) -> None:
    assert [value.type.tensor_type.elem_type for value in (*model.graph.input, *model.graph.output)] == [
        TensorProto.INT64, TensorProto.FLOAT16, TensorProto.FLOAT16]
    (quantized,) = run_ort(model, FEED)
    (source,) = run_ort(half_model(), FEED)
    assert quantized.dtype == np.float16
    assert cosine(quantized.astype(np.float32), source.astype(np.float32)) > 0.99


@pytest.mark.parametrize("mode", ["ptq", "dynamic", "nncf"])
def test_a_float16_model_quantizes_to_an_int8_model_onnx_runtime_loads(tmp_path: Path, mode: str) -> None:
    # the old code: "Type 'tensor(float16)' of input parameter (table_scale) of operator (DequantizeLinear)"
    if mode == "nncf":
        pytest.importorskip("nncf")
    model, findings = _quantize(tmp_path, mode, [])
    _matches_source(model)
    assert "float16" in str(findings["half_precision"])
    expected = {"ptq": {"Gather": 1, "Gemm": 1}, "dynamic": {"MatMulInteger": 1}, "nncf": {"MatMul": 1}}
    assert findings["quantized_nodes"] == expected[mode]


@pytest.mark.parametrize("mode", ["ptq", "dynamic"])
def test_what_stays_float_in_a_float16_model_is_stored_in_float16(tmp_path: Path, mode: str) -> None:
    model, findings = _quantize(tmp_path, mode, ["Gather"])  # a float table, as BERT's embeddings stay
    _matches_source(model)
    stored = {tensor.name: tensor.data_type for tensor in model.graph.initializer}
    assert stored["table"] == TensorProto.FLOAT16  # not float32: twice the source's bytes
    # the old code's dynamic build left the MatMul float behind the Casts ONNX Runtime's optimizer put around it
    assert findings["quantized_nodes"] == {"ptq": {"Gemm": 1}, "dynamic": {"MatMulInteger": 1}}[mode]
