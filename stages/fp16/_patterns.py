"""Graph patterns that stay float32 by default, found without data.

- **Normalisations written out op by op** (``normalizations``): LayerNorm
  (ReduceMean, Sub, square, ReduceMean, Add eps, Sqrt, Div), RMSNorm (square,
  ReduceMean, Add eps, Sqrt, Div or Reciprocal then Mul) and L2 normalisation
  (ReduceSum / ReduceSumSquare / ReduceL2).  The square of x overflows float16
  once |x| passes 256, the mean of an Inf is Inf and x / Inf is 0: an RMSNorm
  fed activations in the hundreds computes all zeros in float16.  The match is
  structural: a reduction of x squared, a chain of ops on that statistic (Add,
  Sqrt, Reciprocal, Pow, Div, Max, Clip, Cast), ending at a Mul or Div that
  applies it to x again; the scale Mul and bias Add after it go with it, so
  ONNX Runtime's LayerNorm fusions never meet a mixed-precision copy.
- **Integer accumulators** (``integer_accumulators``): the Cast that turns the
  int32 result of an op on 8-bit integers (MatMulInteger, ConvInteger) into
  float, and the Mul that rescales it.  An int32 sum of products passes 65504
  long before it passes int32's range.
- **Constants beyond float16's range** (``out_of_range_constants``): a constant
  the converter would clamp (a BatchNormalization variance of 1e8, say) changes
  the result silently; its readers stay float32 with it.  Values of 1e30 and
  more stand in for infinity (attention masks, Clip bounds) and clamp harmlessly.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from qdeploy.graph.utils import float32_chunks
from qdeploy.stages.fp16._graph import FLOAT, walk_graphs, walk_nodes

if TYPE_CHECKING:
    import numpy as np
    import onnx

INFINITY_STAND_IN = 1e30
"""Constants at least this large stand for +-infinity; clamping them to +-max_finite_val keeps their meaning."""
STATISTIC_OPS = frozenset({"Add", "Sqrt", "Reciprocal", "Pow", "Div", "Max", "Clip", "Cast", "Identity"})
"""Ops a normalisation applies to its reduced statistic before using it (eps, root, inverse)."""
SQUARE_REDUCTIONS = frozenset({"ReduceMean", "ReduceSum"})
"""Reductions of an explicit square (Pow(x, 2) or Mul(x, x))."""
SELF_SQUARING_REDUCTIONS = frozenset({"ReduceSumSquare", "ReduceL2"})
"""Reductions that square their input themselves."""
MAX_STATISTIC_DEPTH = 6
INTEGER_8BIT = frozenset({2, 3})  # onnx.TensorProto.UINT8, INT8
INT32 = 6


@dataclass
class _Scope:
    """Producers, readers and scalar constants of one graph."""

    graph: onnx.GraphProto
    producer: dict[str, onnx.NodeProto] = field(default_factory=dict)
    readers: dict[str, list[onnx.NodeProto]] = field(default_factory=dict)
    scalars: dict[str, float] = field(default_factory=dict)
    constants: set[str] = field(default_factory=set)

    @classmethod
    def of(cls, graph: onnx.GraphProto) -> _Scope:
        scope = cls(graph)
        for node in graph.node:
            for out in node.output:
                if out:
                    scope.producer[out] = node
            for name in node.input:
                scope.readers.setdefault(name, []).append(node)
        scope.scalars = dict(_scalar_constants(graph))
        scope.constants = {init.name for init in graph.initializer}
        scope.constants.update(node.output[0] for node in graph.node if node.op_type == "Constant" and node.output)
        return scope

    def is_constant(self, name: str) -> bool:
        return name in self.constants


def normalizations(model: onnx.ModelProto) -> dict[str, str]:
    """Nodes of normalisations written out op by op, in every graph: node name -> why it stays float32."""
    found: dict[str, str] = {}
    for graph in walk_graphs(model.graph):
        scope = _Scope.of(graph)
        for node in graph.node:
            match = _normalization_at(scope, node)
            if match is not None:
                kind, nodes, applied = match
                for member in nodes:
                    found.setdefault(member.name, f"{kind} written out op by op, applied at '{applied.name}': "
                                                  "its square overflows float16 above |x| = 256")
    return found


def _normalization_at(scope: _Scope, reduce: onnx.NodeProto) -> tuple[str, list[onnx.NodeProto],
                                                                         onnx.NodeProto] | None:
    """(kind, member nodes, the node applying the statistic) when `reduce` reduces a square of some x."""
    square = _square_of(scope, reduce)
    if square is None:
        return None
    x, squaring = square
    path = _statistic_path(scope, reduce.output[0], x, MAX_STATISTIC_DEPTH)
    if path is None:
        return None
    applied = path[-1]
    centering = _centering(scope, x)
    kind = "LayerNorm" if centering else ("RMSNorm" if reduce.op_type == "ReduceMean" else "L2 normalisation")
    return kind, [*centering, *squaring, reduce, *path, *_affine_after(scope, applied)], applied


def _square_of(scope: _Scope, reduce: onnx.NodeProto) -> tuple[str, list[onnx.NodeProto]] | None:
    """(x, squaring nodes) when the reduction's input is x squared (or it squares x itself)."""
    if not reduce.input:
        return None
    if reduce.op_type in SELF_SQUARING_REDUCTIONS:
        return reduce.input[0], []
    if reduce.op_type not in SQUARE_REDUCTIONS:
        return None
    square = scope.producer.get(reduce.input[0])
    if square is None:
        return None
    if square.op_type == "Mul" and len(square.input) == 2 and square.input[0] == square.input[1]:
        return square.input[0], [square]
    if square.op_type == "Pow" and len(square.input) == 2 and scope.scalars.get(square.input[1]) == 2.0:
        return square.input[0], [square]
    return None


def _statistic_path(scope: _Scope, statistic: str, x: str, depth: int) -> list[onnx.NodeProto] | None:
    """Nodes from the reduced statistic to the Mul/Div that applies it to x (breadth of readers, depth-limited)."""
    if depth == 0:
        return None
    for reader in scope.readers.get(statistic, []):
        if reader.op_type in ("Mul", "Div") and x in reader.input and statistic in reader.input \
                and (reader.op_type == "Mul" or reader.input[0] == x):
            return [reader]
        others = [name for name in reader.input if name and name != statistic]
        if reader.op_type in STATISTIC_OPS and reader.output and all(scope.is_constant(n) for n in others):
            rest = _statistic_path(scope, reader.output[0], x, depth - 1)
            if rest is not None:
                return [reader, *rest]
    return None


def _centering(scope: _Scope, x: str) -> list[onnx.NodeProto]:
    """[ReduceMean, Sub] when x = y - ReduceMean(y), else []."""
    sub = scope.producer.get(x)
    if sub is None or sub.op_type != "Sub" or len(sub.input) != 2:
        return []
    mean = scope.producer.get(sub.input[1])
    if mean is not None and mean.op_type == "ReduceMean" and mean.input and mean.input[0] == sub.input[0]:
        return [mean, sub]
    return []


def _affine_after(scope: _Scope, applied: onnx.NodeProto) -> list[onnx.NodeProto]:
    """The scale Mul and bias Add by constants that follow the normalisation, when present."""
    found = []
    current = applied
    for op_type in ("Mul", "Add"):
        readers = scope.readers.get(current.output[0], [])
        step = next((r for r in readers if r.op_type == op_type
                     and any(scope.is_constant(name) for name in r.input if name != current.output[0])), None)
        if step is None:
            break
        found.append(step)
        current = step
    return found


def integer_accumulators(model: onnx.ModelProto, types: dict[str, int]) -> dict[str, str]:
    """Casts from the int32 result of an op on 8-bit integers to float, and the Muls rescaling them."""
    found: dict[str, str] = {}
    for graph in walk_graphs(model.graph):
        scope = _Scope.of(graph)
        for cast in graph.node:
            source = scope.producer.get(cast.input[0]) if cast.op_type == "Cast" and cast.input else None
            if source is None or types.get(cast.input[0]) != INT32 or types.get(cast.output[0]) != FLOAT \
                    or not any(types.get(name) in INTEGER_8BIT for name in source.input if name):
                continue
            reason = f"float copy of the int32 accumulator of '{source.name}' ({source.op_type}): may pass 65504"
            found[cast.name] = reason
            for reader in scope.readers.get(cast.output[0], []):
                if reader.op_type == "Mul":
                    found[reader.name] = reason
    return found


SCATTER_OPS = frozenset({"ScatterElements", "ScatterND"})


def scatter_reductions(model: onnx.ModelProto) -> dict[str, str]:
    """Scatters that accumulate (``reduction`` add, mul, max or min): a graph network's message sums add up many
    values in place, and ONNX Runtime's CPU provider has no float16 kernel for them (1.32 loads the model, then
    fails every run: minimol's fp16 artifact)."""
    found: dict[str, str] = {}
    for graph in walk_graphs(model.graph):
        for node in graph.node:
            reduction = next((attr.s.decode() for attr in node.attribute if attr.name == "reduction"), "none")
            if node.op_type in SCATTER_OPS and reduction != "none":
                found[node.name] = (f"{node.op_type} with reduction '{reduction}' accumulates in place: float16 "
                                    "sums lose precision, and ONNX Runtime's CPU provider has no float16 kernel")
    return found


def out_of_range_constants(model: onnx.ModelProto, max_finite_val: float) -> dict[str, str]:
    """Constant nodes and readers of float constants with finite values beyond max_finite_val (below 1e30)."""
    import numpy as np

    big: dict[str, float] = {}
    for name, values in _float_constants(model):
        magnitude = np.abs(values)  # NaN and inf fail both comparisons below
        real = magnitude[(magnitude > max_finite_val) & (magnitude < INFINITY_STAND_IN)]
        if real.size:
            big[name] = max(big.get(name, 0.0), float(real.max()))
    found: dict[str, str] = {}
    for node, _ in walk_nodes(model.graph):
        for name in (*node.input, *(node.output if node.op_type == "Constant" else ())):
            if name in big:
                found.setdefault(node.name, f"constant '{name}' holds {big[name]:.4g}, beyond float16's "
                                            f"{max_finite_val:g}: clamping it would change the result")
    return found


def _float_constants(model: onnx.ModelProto) -> Iterator[tuple[str, np.ndarray]]:
    """(name, values) of every float32 initializer and Constant node of every graph; a large initializer comes in
    pieces (``float32_chunks``), the same name once per piece."""
    import numpy as np
    from onnx import numpy_helper


    for graph in walk_graphs(model.graph):
        for init in graph.initializer:
            if init.data_type == FLOAT:
                for chunk in float32_chunks(init):
                    yield init.name, chunk
        for node in graph.node:
            if node.op_type != "Constant" or not node.output:
                continue
            for attr in node.attribute:
                if attr.name == "value" and attr.t.data_type == FLOAT:
                    yield node.output[0], numpy_helper.to_array(attr.t)
                elif attr.name in ("value_float", "value_floats"):
                    yield node.output[0], np.asarray(attr.f if attr.name == "value_float" else attr.floats,
                                                     np.float32)


def _scalar_constants(graph: onnx.GraphProto) -> Iterator[tuple[str, float]]:
    """Single-valued float constants of one graph (exponents, eps)."""
    from onnx import numpy_helper

    tensors = [(init.name, init) for init in graph.initializer]
    tensors += [(node.output[0], attr.t) for node in graph.node if node.op_type == "Constant" and node.output
                for attr in node.attribute if attr.name == "value" and attr.HasField("t")]
    for name, tensor in tensors:
        if all(dim == 1 for dim in tensor.dims) and tensor.data_type in (1, 10, 11):  # float, float16, double
            yield name, float(numpy_helper.to_array(tensor).reshape(-1)[0])
    for node in graph.node:
        for attr in node.attribute:
            if node.op_type == "Constant" and attr.name == "value_float":
                yield node.output[0], attr.f
