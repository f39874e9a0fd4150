"""An LSTM with peepholes reaches OpenVINO written out as Scans (``qdeploy.graph.lstm_peepholes``): OpenVINO 2026.4
reads the LSTM and drops the peepholes (madmom's beat tracker: cosine 0.25 against ONNX Runtime)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from qdeploy.graph.lstm_peepholes import write_out_peephole_lstms

HIDDEN, FEATURES, STEPS, BATCH = 4, 6, 7, 2


def _lstm(direction: str, *, initial: bool, peepholes: bool = True, opset: int = 18, **attributes: object
          ) -> onnx.ModelProto:
    dirs = 2 if direction == "bidirectional" else 1
    rng = np.random.default_rng(0)
    arrays = {"W": (dirs, 4 * HIDDEN, FEATURES), "R": (dirs, 4 * HIDDEN, HIDDEN), "B": (dirs, 8 * HIDDEN),
              "P": (dirs, 3 * HIDDEN)}
    weights = [numpy_helper.from_array((rng.normal(0, 0.4, shape) * (peepholes or name != "P")).astype(np.float32),
                                       name) for name, shape in arrays.items()]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [STEPS, BATCH, FEATURES])]
    if initial:
        inputs += [helper.make_tensor_value_info(name, TensorProto.FLOAT, [dirs, BATCH, HIDDEN])
                   for name in ("h0", "c0")]
    states = ["h0", "c0"] if initial else ["", ""]
    node = helper.make_node("LSTM", ["x", "W", "R", "B", "", *states, "P"], ["y", "y_h", "y_c"], name="lstm",
                            hidden_size=HIDDEN, direction=direction, **attributes)
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [STEPS, dirs, BATCH, HIDDEN]),
               *(helper.make_tensor_value_info(name, TensorProto.FLOAT, [dirs, BATCH, HIDDEN])
                 for name in ("y_h", "y_c"))]
    graph = helper.make_graph([node], "g", inputs, outputs, weights)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


def _feeds(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(1)
    shapes = {value.name: [dim.dim_value for dim in value.type.tensor_type.shape.dim] for value in model.graph.input}
    return {name: rng.normal(0, 1, shape).astype(np.float32) for name, shape in shapes.items()}


def _ort(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)


@pytest.mark.parametrize(("direction", "initial", "opset"), [("forward", True, 18), ("reverse", False, 18),
                                                              ("bidirectional", True, 18),
                                                              ("bidirectional", False, 11)])
def test_the_written_out_lstm_computes_what_the_lstm_does_on_onnx_runtime_and_on_openvino(
        direction: str, initial: bool, opset: int, tmp_path: Path) -> None:
    import openvino as ov

    from qdeploy.targets.openvino_read import read_onnx

    model = _lstm(direction, initial=initial, opset=opset)
    feeds, want = _feeds(model), _ort(model, _feeds(model))
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    assert write_out_peephole_lstms(copy) == ["lstm"]
    onnx.checker.check_model(copy, full_check=True)
    assert "LSTM" not in {node.op_type for node in copy.graph.node}
    for got, expected in zip(_ort(copy, feeds), want, strict=True):
        np.testing.assert_allclose(got, expected, atol=1e-6)

    onnx.save(model, tmp_path / "m.onnx")
    core = ov.Core()
    read, notes = read_onnx(core, tmp_path / "m.onnx")
    assert len(notes) == 1 and "1 LSTM node(s) with peepholes" in notes[0]
    outputs = core.compile_model(read, "CPU", {"INFERENCE_PRECISION_HINT": "f32"})(feeds)
    for index, expected in enumerate(want):
        np.testing.assert_allclose(np.asarray(outputs[index]), expected, atol=1e-5)
    plain = core.compile_model(core.read_model(str(tmp_path / "m.onnx")), "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    if np.abs(np.asarray(plain(feeds)[0]) - want[0]).max() < 1e-4:
        pytest.skip("this OpenVINO computes LSTM peepholes itself: the rewrite is no longer needed")


@pytest.mark.parametrize("attributes", [{"peepholes": False}, {"clip": 3.0}, {"input_forget": 1}])
def test_an_lstm_without_peepholes_or_with_what_the_scan_does_not_write_is_left_alone(attributes: dict) -> None:
    peepholes = attributes.pop("peepholes", True)
    model = _lstm("forward", initial=True, peepholes=peepholes, **attributes)
    before = model.SerializeToString()
    assert write_out_peephole_lstms(model) == []
    assert model.SerializeToString() == before
