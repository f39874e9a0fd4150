"""A constant added to ``(1 - mask) * finfo.min``: OpenVINO's CPU plugin regroups the sum and loses the constant
(traceforge's flan-t5 encoder after simplify folded its position bias: cosine 0.80); qdeploy's OpenVINO read puts
an exact identity, ``Max(x, -inf)``, after the product (``qdeploy.graph.offset_barrier``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import openvino as ov
import pytest
from onnx import TensorProto, helper, numpy_helper

from qdeploy.graph.offset_barrier import shield_mask_products
from qdeploy.targets.openvino_read import read_onnx

LOWEST = float(np.finfo(np.float32).min)


def _masked_bias(factor: float = LOWEST, *, constant_bias: bool = True) -> onnx.ModelProto:
    """bias [1, 4, 8, 8] + Slice((1 - mask) * factor): a T5 encoder's position bias and its attention mask."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(np.array(1.0, np.float32), "one"),
             numpy_helper.from_array(np.array(factor, np.float32), "factor"),
             numpy_helper.from_array(np.array([0], np.int64), "start"),
             numpy_helper.from_array(np.array([8], np.int64), "end"),
             numpy_helper.from_array(np.array([3], np.int64), "axis")]
    inputs = [helper.make_tensor_value_info("mask", TensorProto.FLOAT, [1, 1, 1, 8])]
    if constant_bias:
        inits.append(numpy_helper.from_array((rng.normal(size=(1, 4, 8, 8)) * 5).astype(np.float32), "bias"))
    else:
        inputs.append(helper.make_tensor_value_info("bias", TensorProto.FLOAT, [1, 4, 8, 8]))
    nodes = [helper.make_node("Sub", ["one", "mask"], ["inverted"]),
             helper.make_node("Mul", ["inverted", "factor"], ["masked"], name="mask_product"),
             helper.make_node("Slice", ["masked", "start", "end", "axis"], ["sliced"]),
             helper.make_node("Add", ["bias", "sliced"], ["scores"])]
    graph = helper.make_graph(nodes, "masked_bias", inputs,
                              [helper.make_tensor_value_info("scores", TensorProto.FLOAT, [1, 4, 8, 8])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("hint", ["f32", "bf16"])
def test_openvino_keeps_the_constant_added_to_a_mask_product(tmp_path: Path, hint: str) -> None:
    path = tmp_path / "masked_bias.onnx"
    onnx.save(_masked_bias(), path)
    mask = np.ones((1, 1, 1, 8), np.float32)
    mask[..., 5:] = 0.0
    expected = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"mask": mask})[0]

    core = ov.Core()
    model, notes = read_onnx(core, path)
    got = core.compile_model(model, "CPU", {"INFERENCE_PRECISION_HINT": hint})({"mask": mask})[0]

    if hint == "f32":
        np.testing.assert_array_equal(got, expected)
    else:  # bf16 rounds the bias; the masked positions stay finfo.min, the others near the bias
        kept = mask[0, 0, 0] == 1.0
        np.testing.assert_allclose(got[..., kept], expected[..., kept], rtol=2e-2, atol=0.1)
        assert np.all(got[..., ~kept] < -1e38)
    assert notes and "Mul 'mask_product'" in notes[0]


def test_only_a_huge_product_with_an_offset_and_a_constant_added_is_shielded() -> None:
    assert shield_mask_products(_masked_bias()) == ["Mul 'mask_product'"]
    assert shield_mask_products(_masked_bias(factor=-100.0)) == []  # small: the regrouping loses nothing visible
    assert shield_mask_products(_masked_bias(constant_bias=False)) == []  # a computed bias: nothing to regroup into

    model = _masked_bias()
    shield_mask_products(model)
    barrier = next(node for node in model.graph.node if node.op_type == "Max")
    assert [node.input[0] for node in model.graph.node if node.op_type == "Slice"] == [barrier.output[0]]
    onnx.checker.check_model(model)
