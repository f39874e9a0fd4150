"""What two builds of a detector with NMS inside compare element by element (``qdeploy.graph.selection``): the
tensors NMS reads and the outputs it does not reach, never what it selected."""

from __future__ import annotations

import onnx
from onnx import TensorProto, helper

from qdeploy.graph.selection import comparable_tensors
from tests.helpers.detector import detector_model


def test_a_detector_compares_the_boxes_and_scores_nms_reads() -> None:
    assert comparable_tensors(detector_model()) == ["decoded", "class_scores"]


def test_an_output_nms_does_not_reach_is_compared_beside_them() -> None:
    model = detector_model()
    model.graph.output.append(helper.make_tensor_value_info("head", TensorProto.FLOAT, None))
    assert comparable_tensors(model) == ["decoded", "class_scores", "head"]


def test_without_a_selection_or_one_no_output_depends_on_the_outputs_compare_as_they_are() -> None:
    model = detector_model()
    assert comparable_tensors(_without(model, "NonMaxSuppression")) is None
    unreached = detector_model()
    del unreached.graph.output[:]
    unreached.graph.output.append(helper.make_tensor_value_info("decoded", TensorProto.FLOAT, None))
    assert comparable_tensors(unreached) is None


def test_a_selection_that_reads_only_graph_inputs_leaves_nothing_better_to_compare() -> None:
    graph = helper.make_graph([helper.make_node("NonZero", ["x"], ["where"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
                              [helper.make_tensor_value_info("where", TensorProto.INT64, None)])
    assert comparable_tensors(helper.make_model(graph)) is None


def _without(model: onnx.ModelProto, op_type: str) -> onnx.ModelProto:
    """The model with every node of ``op_type`` replaced by an Identity of its first input (a stand-in)."""
    for node in model.graph.node:
        if node.op_type == op_type:
            inputs = node.input[:1]
            node.ClearField("input")
            node.input.extend(inputs)
            node.op_type = "Identity"
            node.ClearField("attribute")
    return model
