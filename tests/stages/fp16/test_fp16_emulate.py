"""Float16 emulation on ORT: it must agree with true float16 arithmetic where that is well defined."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper

from qdeploy.stages.fp16._convert import float16_clamper
from qdeploy.stages.fp16._emulate import GATES_INPUT, emulation_twin, gated_twin
from qdeploy.stages.fp16._types import all_types
from tests.helpers.fp16 import const, make_model, run_ort, run_reference, run_stage, tensor
from tests.helpers.peak import peak_mib


def _elementwise() -> onnx.ModelProto:
    nodes = [helper.make_node("Mul", ["x", "a"], ["m"], name="mul"),
             helper.make_node("Add", ["m", "b"], ["s"], name="add"),
             helper.make_node("Div", ["s", "x"], ["d"], name="div"),
             helper.make_node("Sqrt", ["d"], ["r"], name="sqrt"),
             helper.make_node("Sub", ["r", "x"], ["y"], name="sub")]
    return make_model(nodes, [const("a", 3.3), const("b", 1000.7)], [tensor("x", [64])], [tensor("y", [64])])


def _x() -> dict[str, np.ndarray]:
    return {"x": np.random.default_rng(4).uniform(0.5, 300.0, 64).astype(np.float32)}


def _run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)


def test_emulation_twin_matches_true_float16_arithmetic_bit_for_bit(tmp_path: Path) -> None:
    """Correctly rounded float32 +, *, /, sqrt then rounded to float16 equal float16's own results."""
    converted = run_stage(tmp_path, _elementwise(), keep_io_types=False).model
    twin = emulation_twin(converted)
    assert all(value.type.tensor_type.elem_type == onnx.TensorProto.FLOAT for value in twin.graph.input)
    x = _x()
    emulated = _run(twin, x)[0]
    true_float16 = run_reference(converted, {"x": x["x"].astype(np.float16)})[0]
    np.testing.assert_array_equal(emulated, true_float16.astype(np.float32))
    assert not np.array_equal(emulated, run_ort(_elementwise(), x)[0])  # and it is not float32


def test_gated_twin_spans_float32_to_float16(tmp_path: Path) -> None:
    model = onnx.shape_inference.infer_shapes(_elementwise())
    gates = {node.name: index for index, node in enumerate(model.graph.node)}
    twin = gated_twin(model, gates, {}, keep_io_types=True,
                      to_float16=float16_clamper(5.96e-8, 65504.0))
    x = _x()
    off = _run(twin, {**x, GATES_INPUT: np.zeros(len(gates), bool)})[0]
    on = _run(twin, {**x, GATES_INPUT: np.ones(len(gates), bool)})[0]
    np.testing.assert_array_equal(off, run_ort(model, x)[0])  # all gates off: the float32 model
    artifact = run_stage(tmp_path, _elementwise()).model
    np.testing.assert_array_equal(on, _run(emulation_twin(artifact), x)[0])  # all on: the emulated artifact
    assert all_types(twin)[GATES_INPUT] == onnx.TensorProto.BOOL


def test_a_large_weight_stays_float16_in_the_twin_and_computes_the_same(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Large float16 weights are read through a Cast (the twin holds them once, as float16): same outputs, bit for
    bit, as a twin that stores them upcast to float32."""
    weight = np.random.default_rng(5).standard_normal((64, 64)).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"], name="mm"),
             helper.make_node("Relu", ["m"], ["y"], name="relu")]
    model = make_model(nodes, [const("w", weight)], [tensor("x", [4, 64])], [tensor("y", [4, 64])])
    converted = run_stage(tmp_path, model).model
    x = {"x": np.random.default_rng(6).standard_normal((4, 64)).astype(np.float32)}

    twin = emulation_twin(converted, expose=True)
    weights = {init.name: init for init in twin.graph.initializer}
    assert weights["w"].data_type == onnx.TensorProto.FLOAT16
    assert any(node.op_type == "Cast" and node.input == ["w"] for node in twin.graph.node)
    monkeypatch.setattr("qdeploy.graph.light.STRIP_MIN_BYTES", 1 << 40)  # nothing is large: every weight upcast
    upcast = emulation_twin(converted, expose=True)
    assert {init.name: init.data_type for init in upcast.graph.initializer}["w"] == onnx.TensorProto.FLOAT
    for got, want in zip(_run(twin, x), _run(upcast, x), strict=True):
        np.testing.assert_array_equal(got, want)


def test_a_large_weight_listed_as_a_graph_input_is_emulated_too(tmp_path: Path) -> None:
    """IR < 4 models list their weights as graph inputs: such a weight is upcast like a small one."""
    weight = np.random.default_rng(7).standard_normal((64, 64)).astype(np.float16)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")]
    half = onnx.TensorProto.FLOAT16
    inputs = [tensor("x", [4, 64], half), tensor("w", [64, 64], half)]
    model = make_model(nodes, [const("w", weight, np.float16)], inputs, [tensor("y", [4, 64], half)])
    model.ir_version = 3

    twin = emulation_twin(model)

    assert {init.name: init.data_type for init in twin.graph.initializer}["w"] == onnx.TensorProto.FLOAT
    x = np.random.default_rng(8).standard_normal((4, 64)).astype(np.float32)
    got = _run(twin, {"x": x})[0]
    want = (x.astype(np.float16).astype(np.float32) @ weight.astype(np.float32)).astype(np.float16)
    np.testing.assert_allclose(got, want.astype(np.float32), rtol=2e-3, atol=2e-3)


def test_the_emulation_holds_one_float32_weight_at_a_time(tmp_path: Path) -> None:
    """Three 32 MB float16 weights: the emulated run's peak stays below the float16 weights plus two float32
    copies (ONNX Runtime's default order ran every weight's Cast first: all three float32 copies at once)."""
    setup = """
        import numpy as np
        from pathlib import Path
        from onnx import TensorProto, helper, numpy_helper
        from qdeploy.stages.fp16._fidelity import run_emulated

        d = 4096
        weights = [numpy_helper.from_array(np.full((d, d), 0.001, np.float16), f"w{i}") for i in range(3)]
        nodes, x = [], "x"
        for i in range(3):
            nodes.append(helper.make_node("MatMul", [x, f"w{i}"], [f"m{i}"], name=f"mm{i}"))
            x = f"m{i}"
        half = TensorProto.FLOAT16
        model = helper.make_model(helper.make_graph(
            nodes, "g", [helper.make_tensor_value_info("x", half, [1, d])],
            [helper.make_tensor_value_info(x, half, [1, d])], weights), opset_imports=[helper.make_opsetid("", 17)])
        del weights
        feeds = [{"x": np.ones((1, d), np.float32)}]
    """
    measured = f"""
        run_emulated(model, feeds, {{}}, Path({str(tmp_path)!r}))
    """
    # float16 weights 96 MB (a copy for the twin) + float32 copies 64 MB each: three at once would be ~290 MB
    assert peak_mib(tmp_path, setup, measured, timeout=120) < 250


def test_the_emulation_probes_hold_one_activation_at_a_time(tmp_path: Path) -> None:
    """Eight 16 MB activations in a chain: each non-finite probe runs right after its tensor is made, so the run
    holds a few at once (with the probes at the end of the graph, every activation waited for them: ~130 MB)."""
    setup = """
        import numpy as np
        from pathlib import Path
        from onnx import TensorProto, helper
        from qdeploy.stages.fp16._fidelity import run_emulated

        n, x, nodes = 1 << 22, "x", []
        for i in range(8):
            nodes.append(helper.make_node("Sin" if i % 2 else "Cos", [x], [f"a{i}"], name=f"n{i}"))
            x = f"a{i}"
        half = TensorProto.FLOAT16
        graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", half, [n])],
                                  [helper.make_tensor_value_info(x, half, [n])])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        model = __import__("onnx").shape_inference.infer_shapes(model)
        feeds = [{"x": np.ones(n, np.float32)}]
    """
    measured = f"""
        run_emulated(model, feeds, {{}}, Path({str(tmp_path)!r}))
    """
    peak = peak_mib(tmp_path, setup, measured, timeout=120)
    assert peak < 90, peak
