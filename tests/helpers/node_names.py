"""A model whose nodes may be nameless or repeat a name (issue 33): the node-name tests of the stages and of a run."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def nameless_model(names: list[str]) -> onnx.ModelProto:
    """A Conv + Relu branch and MatMul -> Relu -> MatMul (the user's model of issue 33, small)."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array((rng.standard_normal(shape) * 0.1).astype(np.float32), name)
             for name, shape in (("w1", (64, 64)), ("w2", (64, 32)), ("cw", (4, 1, 3, 3)))]
    inits.append(numpy_helper.from_array(np.zeros(4, np.float32), "cb"))
    nodes = [helper.make_node("Conv", ["img", "cw", "cb"], ["c"], name=names[0], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["cr"], name=names[1]),
             helper.make_node("MatMul", ["x", "w1"], ["h"], name=names[2]),
             helper.make_node("Relu", ["h"], ["r"], name=names[3]),
             helper.make_node("MatMul", ["r", "w2"], ["y"], name=names[4])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 64]),
                                           helper.make_tensor_value_info("img", TensorProto.FLOAT, [1, 1, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 32]),
                               helper.make_tensor_value_info("cr", TensorProto.FLOAT, [1, 4, 8, 8])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
