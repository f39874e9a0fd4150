"""A float64 copy of a float32 model: the arbiter when two runtimes' float32 outputs disagree.

Two runtimes running one float32 model differ by their kernels' rounding and approximations: ONNX Runtime's
Sigmoid, say, is accurate to about 5e-8 absolute, which in a probability near 1e-5 is half a percent.  Which of
the two is right is a question for arithmetic both beat by orders of magnitude: every float32 value of the
model (inputs, outputs, initializers, constants, casts to float) widened to float64, run by onnx's reference
evaluator (``qdeploy.stages.validate._arbiter``).  Integer and other tensors stay as they are.

Edits a copy; the weights must be loaded (widening reads their values).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import onnx

__all__ = ["to_float64"]

_FLOAT, _DOUBLE = 1, 11  # TensorProto.FLOAT, TensorProto.DOUBLE
_TYPE_ATTRIBUTES = {"Cast": "to", "EyeLike": "dtype", "RandomNormal": "dtype", "RandomUniform": "dtype",
                    "RandomNormalLike": "dtype", "RandomUniformLike": "dtype", "Multinomial": "dtype",
                    "Bernoulli": "dtype"}
"""Ops whose attribute names the element type they produce."""


def to_float64(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``model`` with every float32 tensor, declaration and type attribute made float64, subgraphs
    included."""
    import onnx

    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    _widen_graph(copy.graph)
    return copy


def _widen_graph(graph: onnx.GraphProto) -> None:
    for value in (*graph.input, *graph.output, *graph.value_info):
        _widen_type(value.type)
    for tensor in graph.initializer:
        _widen_tensor(tensor)
    for node in graph.node:
        _widen_node(node)


def _widen_node(node: onnx.NodeProto) -> None:
    from onnx import AttributeProto, helper

    for index, attribute in enumerate(node.attribute):
        if attribute.type == AttributeProto.TENSOR:
            _widen_tensor(attribute.t)
        elif attribute.type == AttributeProto.GRAPH:
            _widen_graph(attribute.g)
        elif attribute.type == AttributeProto.GRAPHS:
            for graph in attribute.graphs:
                _widen_graph(graph)
        elif attribute.name == _TYPE_ATTRIBUTES.get(node.op_type) and attribute.i == _FLOAT:
            attribute.i = _DOUBLE
        elif node.op_type == "Constant" and attribute.name in ("value_float", "value_floats"):
            import numpy as np

            values = attribute.f if attribute.name == "value_float" else list(attribute.floats)
            node.attribute[index].CopyFrom(helper.make_attribute(
                "value", helper.make_tensor("value", _DOUBLE, np.shape(values), np.ravel(values).tolist())))


def _widen_tensor(tensor: onnx.TensorProto) -> None:
    if tensor.data_type != _FLOAT:
        return
    import numpy as np
    from onnx import numpy_helper

    tensor.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(tensor).astype(np.float64), tensor.name))


def _widen_type(kind: onnx.TypeProto) -> None:
    field = kind.WhichOneof("value")
    if field == "tensor_type" and kind.tensor_type.elem_type == _FLOAT:
        kind.tensor_type.elem_type = _DOUBLE
    elif field == "sequence_type":
        _widen_type(kind.sequence_type.elem_type)
    elif field == "optional_type":
        _widen_type(kind.optional_type.elem_type)
    elif field == "map_type":
        _widen_type(kind.map_type.value_type)
