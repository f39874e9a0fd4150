"""An If whose condition has rank above 1 is read by OpenVINO through a Squeeze (``qdeploy.graph.if_condition``)."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from qdeploy.graph.if_condition import squeeze_if_conditions
from qdeploy.graph.names import all_nodes
from tests.control_flow_models import matrix_condition_if_model, nested_constant_if_model

FEEDS = [np.array([[1.0, -0.5, 2.0, 0.25]], np.float32), np.array([[-1.0, -0.5, 2.0, -3.0]], np.float32)]


def _run(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


@pytest.mark.parametrize(("nested", "declared"), [(False, True), (False, False), (True, True), (True, False)])
def test_a_condition_of_rank_two_is_squeezed_and_no_value_changes(nested: bool, declared: bool) -> None:
    original = matrix_condition_if_model(nested=nested, declared=declared)
    model = matrix_condition_if_model(nested=nested, declared=declared)
    assert squeeze_if_conditions(model) == ["If 'verify': condition"]
    onnx.checker.check_model(model, full_check=True)
    verify = next(node for node in all_nodes(model.graph) if node.name == "verify")
    squeeze = next(node for node in all_nodes(model.graph) if node.op_type == "Squeeze")
    assert squeeze.input[0] == "condition" and verify.input[0] == squeeze.output[0]
    for x in FEEDS:  # both branches taken
        np.testing.assert_array_equal(_run(model, x), _run(original, x))
    assert squeeze_if_conditions(model) == []  # a scalar now: nothing more to do


def test_conditions_of_rank_zero_or_one_are_left_as_they_are() -> None:
    model = nested_constant_if_model()
    assert any(node.op_type == "If" for node in all_nodes(model.graph))
    before = model.SerializeToString()
    assert squeeze_if_conditions(model) == []
    assert model.SerializeToString() == before
