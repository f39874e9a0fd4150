"""``qdeploy.graph.shape_values``: what depends on the inputs' shapes only, through subgraphs too."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from qdeploy.graph.shape_values import shape_computed, shape_computed_nodes


def _branch(name: str, source: str) -> onnx.GraphProto:
    """A body returning ``source`` + 1 (``source`` read from the outer scope)."""
    return helper.make_graph([helper.make_node("Add", [source, "one"], [f"{name}_out"], name=f"{name}_add")], name,
                             [], [helper.make_tensor_value_info(f"{name}_out", TensorProto.FLOAT, None)])


def _model() -> onnx.ModelProto:
    """x -> Shape -> ConstantOfShape (shape-computed) -> an If whose branches read it, another whose branch reads
    x; a Mul of x by a weight (data); a Cast of a weight (constant)."""
    nodes = [
        helper.make_node("Shape", ["x"], ["shape"], name="shape"),
        helper.make_node("ConstantOfShape", ["shape"], ["zeros"], name="zeros",
                         value=numpy_helper.from_array(np.array([0.0], np.float32))),
        helper.make_node("If", ["flag"], ["from_shape"], name="if_shape",
                         then_branch=_branch("a", "zeros"), else_branch=_branch("b", "zeros")),
        helper.make_node("If", ["flag"], ["from_data"], name="if_data",
                         then_branch=_branch("c", "zeros"), else_branch=_branch("d", "x")),
        helper.make_node("Mul", ["x", "w"], ["scaled"], name="scale"),
        helper.make_node("Cast", ["w"], ["w64"], name="cast", to=TensorProto.DOUBLE),
        helper.make_node("Add", ["scaled", "from_shape"], ["y"], name="offset"),
    ]
    inits = [numpy_helper.from_array(np.array(True), "flag"), numpy_helper.from_array(np.float32(1.0), "one"),
             numpy_helper.from_array(np.full((1, 2), 2.0, np.float32), "w")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2])],
                              [helper.make_tensor_value_info(name, TensorProto.FLOAT, None)
                               for name in ("y", "from_data")], inits)
    graph.output.append(helper.make_tensor_value_info("w64", TensorProto.DOUBLE, None))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_shape_readers_are_shape_computed_and_a_node_holding_a_subgraph_counts_as_data() -> None:
    found = shape_computed(_model().graph)
    assert found == {"shape", "zeros"}
    # a body may read data from the outer scope: a node holding one is data unless it reads only constants (it
    # is then left to the quantizer, never wrongly kept float or quantized as a shape value)
    assert not found & {"from_shape", "from_data", "x", "scaled", "y", "w64"}


def test_the_nodes_left_float_are_those_writing_or_reading_a_float_shape_computed_tensor() -> None:
    # Shape's output is int64 (nothing a quantizer touches); ConstantOfShape writes float zeros from it
    assert shape_computed_nodes(onnx.shape_inference.infer_shapes(_model())) == ["zeros"]
