"""Loop/Scan bodies that return a loop-carried input unchanged get an Identity in between (nested ones too)."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from qdeploy.graph.loop_carried import isolate_pass_through
from qdeploy.graph.names import all_nodes
from tests.control_flow_models import loop_with_outer_reads_model, pass_through_loop_model


def _run(model: onnx.ModelProto, x: np.ndarray) -> list[np.ndarray]:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})


def _pass_through(model: onnx.ModelProto) -> list[str]:
    """Body outputs (past a Loop's condition) that are the body's own inputs, in every graph."""
    found = []
    for node in all_nodes(model.graph):
        if node.op_type in ("Loop", "Scan"):
            body = node.attribute[0].g
            inputs = {value.name for value in body.input}
            first = 1 if node.op_type == "Loop" else 0
            found += [value.name for value in body.output[first:] if value.name in inputs]
    return found


@pytest.mark.parametrize("nested", [False, True])
def test_pass_through_carried_values_get_an_identity_and_compute_the_same(nested: bool) -> None:
    model = pass_through_loop_model(nested=nested)
    x = np.random.default_rng(0).standard_normal((1, 4)).astype(np.float32)
    before = _run(model, x)
    assert _pass_through(model)
    rewritten = isolate_pass_through(model)
    expected = ["Loop '': w_in", "Loop '': b_in"]
    assert rewritten == (["Loop '': w_outer", *expected] if nested else expected)
    assert _pass_through(model) == []
    onnx.checker.check_model(model, full_check=True)
    np.testing.assert_array_equal(_run(model, x)[0], before[0])
    assert isolate_pass_through(model) == []  # nothing left to rewrite


def test_a_loop_condition_and_bodies_without_pass_through_are_left_alone() -> None:
    model = loop_with_outer_reads_model()  # its body returns Identity(cond) and a computed value
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    assert isolate_pass_through(copy) == [] and copy == model


def test_a_scan_state_passed_through_gets_an_identity() -> None:
    body = helper.make_graph([helper.make_node("Add", ["s", "xi"], ["y_i"])], "scan_body",
                             [helper.make_tensor_value_info("s", TensorProto.FLOAT, [2]),
                              helper.make_tensor_value_info("xi", TensorProto.FLOAT, [2])],
                             [helper.make_tensor_value_info("s", TensorProto.FLOAT, [2]),
                              helper.make_tensor_value_info("y_i", TensorProto.FLOAT, [2])])
    scan = helper.make_node("Scan", ["s0", "x"], ["s_last", "y"], name="scan", body=body, num_scan_inputs=1)
    graph = helper.make_graph([scan], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 2]),
                                            helper.make_tensor_value_info("s0", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    assert isolate_pass_through(model) == ["Scan 'scan': s"]
    assert [node.op_type for node in body_of(model).node] == ["Add", "Identity"]
    onnx.checker.check_model(model, full_check=True)


def body_of(model: onnx.ModelProto) -> onnx.GraphProto:
    return model.graph.node[0].attribute[0].g
