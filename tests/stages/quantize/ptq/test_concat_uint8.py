"""Int8 activation pairs around a Concat moved to uint8 in a finished QDQ graph (``ptq._concat_uint8``): the same
outputs on ONNX Runtime bit for bit, and OpenVINO agreeing with them where it miscomputed int8 at a Concat."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from qdeploy.stages import quantize
from qdeploy.stages.quantize import QuantizeConfig
from qdeploy.stages.quantize.ptq._concat_uint8 import uint8_at_concats
from tests.helpers.quantize import concat_head, openvino_agrees_with_ort, run_ort, save_artifact, stage_context

SIDE, SCALE = 10, 0.05


def _pair(name: str, zero_point: int, nodes: list, inits: list) -> str:
    inits += [numpy_helper.from_array(np.array(SCALE, np.float32), f"{name}_s"),
              numpy_helper.from_array(np.array(zero_point, np.int8), f"{name}_z")]
    nodes += [helper.make_node("QuantizeLinear", [name, f"{name}_s", f"{name}_z"], [f"{name}_q"]),
              helper.make_node("DequantizeLinear", [f"{name}_q", f"{name}_s", f"{name}_z"], [f"{name}_d"])]
    return f"{name}_d"


def _conv(source: str, channels: int, out: str, nodes: list, inits: list, rng: np.random.Generator) -> None:
    weights = rng.normal(0, 0.3, (6, channels, 3, 3)).astype(np.float32)
    scales = (np.abs(weights).reshape(6, -1).max(1) / 127).astype(np.float32)
    inits += [numpy_helper.from_array(np.round(weights / scales[:, None, None, None]).astype(np.int8), f"{out}_wq"),
              numpy_helper.from_array(scales, f"{out}_ws"), numpy_helper.from_array(np.zeros(6, np.int8), f"{out}_wz")]
    nodes += [helper.make_node("DequantizeLinear", [f"{out}_wq", f"{out}_ws", f"{out}_wz"], [f"{out}_w"], axis=0),
              helper.make_node("Conv", [source, f"{out}_w"], [out], pads=[1, 1, 1, 1])]


def _graph() -> onnx.ModelProto:
    """x0 (through a MaxPool) and x1 concatenated into a convolution; x2 into a convolution of its own."""
    rng = np.random.default_rng(0)
    nodes: list = []
    inits: list = []
    # one zero point: OpenVINO miscomputes a Concat of inputs with one scale and two zero points, uint8 or not
    first = _pair("x0", -20, nodes, inits)
    nodes.append(helper.make_node("MaxPool", [first], ["m"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]))
    nodes.append(helper.make_node("Concat", ["m", _pair("x1", -20, nodes, inits)], ["cat"], axis=1))
    _conv("cat", 8, "y", nodes, inits, rng)
    _conv(_pair("x2", 5, nodes, inits), 4, "z", nodes, inits, rng)
    inputs = [helper.make_tensor_value_info(name, TensorProto.FLOAT, [1, 4, SIDE, SIDE]) for name in ("x0", "x1", "x2")]
    outputs = [helper.make_tensor_value_info(name, TensorProto.FLOAT, [1, 6, SIDE, SIDE]) for name in ("y", "z")]
    return helper.make_model(helper.make_graph(nodes, "g", inputs, outputs, inits),
                             opset_imports=[helper.make_opsetid("", 13)])


def _zero_point_types(model: onnx.ModelProto) -> dict[str, int]:
    types = {init.name: init.data_type for init in model.graph.initializer}
    return {node.input[0]: types[node.input[2]] for node in model.graph.node if node.op_type == "QuantizeLinear"}


def test_the_pairs_at_a_concat_move_to_uint8_and_compute_the_same_on_onnx_runtime() -> None:
    model = _graph()
    rng = np.random.default_rng(1)
    feed = {name: rng.normal(0, 3, (1, 4, SIDE, SIDE)).astype(np.float32) for name in ("x0", "x1", "x2")}
    before = run_ort(model, feed)
    rewritten = onnx.ModelProto()
    rewritten.CopyFrom(model)
    assert uint8_at_concats(rewritten) == 2
    assert uint8_at_concats(rewritten) == 0  # nothing int8 is left at the Concat
    assert _zero_point_types(rewritten) == {"x0": TensorProto.UINT8, "x1": TensorProto.UINT8, "x2": TensorProto.INT8}
    onnx.checker.check_model(rewritten)
    for got, want in zip(run_ort(rewritten, feed), before, strict=True):
        np.testing.assert_array_equal(got, want)  # the same values rounded and dequantized
    assert openvino_agrees_with_ort(rewritten, feed) > 0.999


@pytest.mark.parametrize(("targets", "openvino_runs"), [(("ort:cpu", "openvino:cpu"), True), (("ort:cpu",), False)])
def test_nncf_graphs_that_openvino_runs_have_no_int8_at_a_concat(tmp_path: Path, targets: tuple[str, ...],
                                                                 openvino_runs: bool) -> None:
    pytest.importorskip("nncf", reason="engine nncf is optional (pip install 'qdeploy[nncf]')")
    artifact = save_artifact(tmp_path, concat_head())
    context = dataclasses.replace(stage_context(tmp_path, ranges={"x": (-2.0, 2.0)}), targets=targets)
    result = quantize.run(artifact, QuantizeConfig(engine="nncf", calibration={"samples": 4}), context)
    near_concat = {tensor: kind for tensor, kind in _zero_point_types(result.model).items()
                   if tensor in ("y1", "p1", "y2", "cat")}
    assert near_concat, _zero_point_types(result.model)
    note = result.report().get("uint8_at_concats") or ""
    if openvino_runs:
        assert set(near_concat.values()) == {TensorProto.UINT8} and note.endswith("VNNI CPUs without AMX"), note
        assert openvino_agrees_with_ort(result.model) > 0.999
    else:
        assert TensorProto.INT8 in near_concat.values() and not note
