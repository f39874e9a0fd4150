"""Float tensors of a model widened to a wider float type, the same function computed in more bits.

- ``to_float64``: a float64 copy of a float32 model, the arbiter when two runtimes' float32 outputs disagree.
  Two runtimes running one float32 model differ by their kernels' rounding and approximations: ONNX Runtime's
  Sigmoid, say, is accurate to about 5e-8 absolute, which in a probability near 1e-5 is half a percent.  Which
  of the two is right is a question for arithmetic both beat by orders of magnitude: every float32 value of the
  model (inputs, outputs, initializers, constants, casts to float) widened to float64, run by onnx's reference
  evaluator (``qdeploy.stages.validate._arbiter``).
- ``half_to_float32``: a float16 or bfloat16 model made float32 inside, in place, its inputs and outputs keeping
  their types through a Cast each: what int8 quantization starts from (ONNX Runtime's quantizer writes scales in
  the weights' type, which DequantizeLinear accepts in float16 only from opset 19, and its calibration reads
  float32).  Every half-precision value is exact in float32.
- ``widen_cast_weights``: half weights a float32 model stores narrow and casts to float32 (simplify keeps them so)
  made float32 weights in place of their Casts: what the fp16 stage converts, the same values.

Integer and other tensors stay as they are; weights must be loaded (widening reads their values).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from qdeploy.graph.utils import delete_indices, delete_where, names_read, rename_uses

if TYPE_CHECKING:
    import onnx

__all__ = ["half_to_float32", "half_weights", "holds_half", "narrow_weights", "to_float64", "widen_cast_weights"]

_FLOAT, _FLOAT16, _DOUBLE, _BFLOAT16 = 1, 10, 11, 16  # TensorProto's element types
_HALF = frozenset({_FLOAT16, _BFLOAT16})
_TYPE_ATTRIBUTES = {"Cast": "to", "EyeLike": "dtype", "RandomNormal": "dtype", "RandomUniform": "dtype",
                    "RandomNormalLike": "dtype", "RandomUniformLike": "dtype", "Multinomial": "dtype",
                    "Bernoulli": "dtype"}
"""Ops whose attribute names the element type they produce."""


@dataclass(frozen=True)
class _Widening:
    sources: frozenset[int]
    target: int
    numpy_target: str


_TO_FLOAT64 = _Widening(frozenset({_FLOAT}), _DOUBLE, "float64")
_TO_FLOAT32 = _Widening(_HALF, _FLOAT, "float32")


def to_float64(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``model`` with every float32 tensor, declaration and type attribute made float64, subgraphs
    included."""
    import onnx

    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    _widen_graph(copy.graph, _TO_FLOAT64)
    return copy


def holds_half(model: onnx.ModelProto) -> bool:
    """Whether any tensor, declaration, type attribute or Constant of the model (subgraphs included) is float16
    or bfloat16."""
    return _Finder().graph(model.graph)


def half_to_float32(model: onnx.ModelProto) -> int:
    """Make every float16 and bfloat16 value inside ``model`` float32, in place; how many inputs and outputs
    kept their half type through a Cast.  Each half input is read through a Cast to float32 and each half
    output written through a Cast back, under the model's own names: callers feed and read the same types."""
    from onnx import helper

    graph = model.graph
    interface = [value for value in (*graph.input, *graph.output) if _elem_type(value.type) in _HALF]
    kept = {value.name: _elem_type(value.type) for value in interface}
    _widen_graph(graph, _TO_FLOAT32)
    inputs = {value.name for value in graph.input}
    first: list[onnx.NodeProto] = []
    for name, half in kept.items():
        inner = f"{name}__float32"
        if name in inputs:
            rename_uses(graph, name, inner, outputs=False)
            first.append(helper.make_node("Cast", [name], [inner], name=f"{inner}_cast", to=_FLOAT))
            _set_elem_type(graph.input, name, half)
            _set_elem_type(graph.output, name, half)  # an input passed straight out stays what it is
        else:
            _rename_writes(graph, name, inner)
            graph.node.append(helper.make_node("Cast", [inner], [name], name=f"{name}_cast_back", to=half))
            _set_elem_type(graph.output, name, half)
    if first:
        nodes = [*first, *graph.node]
        del graph.node[:]
        graph.node.extend(nodes)
    return len(kept)


def half_weights(model: onnx.ModelProto) -> dict[str, int]:
    """The main graph's float16 and bfloat16 initializers: name -> element type."""
    return {tensor.name: tensor.data_type for tensor in model.graph.initializer if tensor.data_type in _HALF}


NARROW_FROM_ELEMENTS = 1024
"""Weights smaller than this stay float32: a Cast per bias or scale saves nothing worth a node."""


def narrow_weights(model: onnx.ModelProto, types: dict[str, int]) -> int:
    """The main graph's float32 initializers named in ``types`` stored in that half type again, each read through
    a Cast to float32 placed first: a weight ``half_to_float32`` widened that stayed float takes its original
    bytes on disk, not twice them (ONNX Runtime folds the Cast when it loads the model).  How many."""
    import numpy as np
    import onnx
    from onnx import helper, numpy_helper

    graph = model.graph
    casts = []
    for tensor in graph.initializer:
        half = types.get(tensor.name)
        if half is None or tensor.data_type != _FLOAT or np.prod(tensor.dims) < NARROW_FROM_ELEMENTS:
            continue
        if tensor.data_location == onnx.TensorProto.EXTERNAL:  # its bytes are in a file: left as they are
            continue
        name, wide = tensor.name, f"{tensor.name}__float32"
        rename_uses(graph, name, wide, outputs=False)
        numpy_type = helper.tensor_dtype_to_np_dtype(half)
        tensor.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(tensor).astype(numpy_type), name))
        casts.append(helper.make_node("Cast", [name], [wide], name=f"{wide}_cast", to=_FLOAT))
    if casts:
        nodes = [*casts, *graph.node]
        del graph.node[:]
        graph.node.extend(nodes)
    return len(casts)


def _widen_graph(graph: onnx.GraphProto, widening: _Widening) -> None:
    for value in (*graph.input, *graph.output, *graph.value_info):
        _widen_type(value.type, widening)
    for tensor in graph.initializer:
        _widen_tensor(tensor, widening)
    for node in graph.node:
        _widen_node(node, widening)


def _widen_node(node: onnx.NodeProto, widening: _Widening) -> None:
    from onnx import AttributeProto, helper

    for index, attribute in enumerate(node.attribute):
        if attribute.type == AttributeProto.TENSOR:
            _widen_tensor(attribute.t, widening)
        elif attribute.type == AttributeProto.GRAPH:
            _widen_graph(attribute.g, widening)
        elif attribute.type == AttributeProto.GRAPHS:
            for graph in attribute.graphs:
                _widen_graph(graph, widening)
        elif attribute.name == _TYPE_ATTRIBUTES.get(node.op_type) and attribute.i in widening.sources:
            attribute.i = widening.target
        elif (widening.target == _DOUBLE and node.op_type == "Constant"
              and attribute.name in ("value_float", "value_floats")):
            import numpy as np

            values = attribute.f if attribute.name == "value_float" else list(attribute.floats)
            node.attribute[index].CopyFrom(helper.make_attribute(
                "value", helper.make_tensor("value", _DOUBLE, np.shape(values), np.ravel(values).tolist())))


def _widen_tensor(tensor: onnx.TensorProto, widening: _Widening) -> None:
    if tensor.data_type not in widening.sources:
        return
    from onnx import numpy_helper

    tensor.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(tensor).astype(widening.numpy_target),
                                            tensor.name))


def _widen_type(kind: onnx.TypeProto, widening: _Widening) -> None:
    field = kind.WhichOneof("value")
    if field == "tensor_type" and kind.tensor_type.elem_type in widening.sources:
        kind.tensor_type.elem_type = widening.target
    elif field == "sequence_type":
        _widen_type(kind.sequence_type.elem_type, widening)
    elif field == "optional_type":
        _widen_type(kind.optional_type.elem_type, widening)
    elif field == "map_type":
        _widen_type(kind.map_type.value_type, widening)


def _elem_type(kind: onnx.TypeProto) -> int:
    return kind.tensor_type.elem_type if kind.WhichOneof("value") == "tensor_type" else 0


def _set_elem_type(values: object, name: str, elem_type: int) -> None:
    for value in values:  # type: ignore[attr-defined]
        if value.name == name:
            value.type.tensor_type.elem_type = elem_type


def _rename_writes(graph: onnx.GraphProto, old: str, new: str) -> None:
    """What writes ``old`` (a graph output: a node or a weight) writes ``new``, and every reader reads ``new``."""
    for node in graph.node:
        node.output[:] = [new if name == old else name for name in node.output]
    for named in (*graph.initializer, *graph.value_info):  # an output may be a weight itself
        if named.name == old:
            named.name = new
    rename_uses(graph, old, new, outputs=False)


class _Finder:
    """Looks for a half-precision element anywhere in a graph, stopping at the first."""

    def graph(self, graph: onnx.GraphProto) -> bool:
        if any(_elem_type(value.type) in _HALF for value in (*graph.input, *graph.output, *graph.value_info)):
            return True
        if any(tensor.data_type in _HALF for tensor in graph.initializer):
            return True
        return any(self.node(node) for node in graph.node)

    def node(self, node: onnx.NodeProto) -> bool:
        from onnx import AttributeProto

        for attribute in node.attribute:
            if attribute.type == AttributeProto.TENSOR and attribute.t.data_type in _HALF:
                return True
            if attribute.type == AttributeProto.GRAPH and self.graph(attribute.g):
                return True
            if attribute.type == AttributeProto.GRAPHS and any(self.graph(g) for g in attribute.graphs):
                return True
            if attribute.name == _TYPE_ATTRIBUTES.get(node.op_type) and attribute.i in _HALF:
                return True
        return False


def widen_cast_weights(model: onnx.ModelProto) -> list[str]:
    """Each Cast to float32 of a float16 or bfloat16 initializer in the main graph replaced by a float32
    initializer of the same values under the Cast's output name, in place; the half weight goes when nothing else
    reads it.  The Casts' names (the weights in a data file are left as they are)."""
    import onnx
    from onnx import numpy_helper

    graph = model.graph
    stored = {tensor.name: tensor for tensor in graph.initializer if tensor.data_type in _HALF
              and tensor.data_location != onnx.TensorProto.EXTERNAL}
    folded = [index for index, node in enumerate(graph.node) if node.op_type == "Cast" and node.input
              and node.input[0] in stored and any(attr.name == "to" and attr.i == _FLOAT for attr in node.attribute)]
    names, made = [], set()
    for index in folded:
        node = graph.node[index]
        names.append(node.name or node.output[0])
        made.add(node.output[0])
        graph.initializer.append(numpy_helper.from_array(
            numpy_helper.to_array(stored[node.input[0]]).astype("float32"), node.output[0]))
    delete_indices(graph.node, folded)
    # an initializer's type is its own: a declared one would go stale when the weight is converted
    delete_where(graph.value_info, lambda value: value.name in made)
    read = names_read(list(graph.node), graph)
    delete_where(graph.initializer, lambda tensor: tensor.name in stored and tensor.name not in read)
    return names
