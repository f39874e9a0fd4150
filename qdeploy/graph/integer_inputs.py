"""Safe values for an integer graph input in seeded random data, read from what the graph does with it.

Random integers are dangerous: an integer input may become Tile repeats, Pad widths, a Range limit, a shape or
gather indices, and 0..99 there asked ONNX Runtime for 16 GB, or indexed past a 4-row embedding table ("indices
element out of data bounds").  So an integer input takes
- [0, rows) when it indexes a table (Gather, GatherElements, GatherND, ScatterElements, ScatterND, through
  value-preserving ops): rows of a constant or a static input, else of the tensor's inferred shape, where a
  symbolic or unknown axis counts 1 row (seeded random data sets every symbolic dimension to 1, and only index 0
  is safe in an axis of unknown length: a graph network's edge list indexes its node features, [num_atoms, 3]),
  else
- [1, SIZE_HIGH) when it becomes a size, a count or a shape (Tile, Expand, Reshape, ConstantOfShape, Range,
  Resize, OneHot, TopK, Pad, Slice, Split, ...), else
- [0, DEFAULT_HIGH);
the ``low``/``high`` a recipe's ``model.inputs`` gives win over all of these (the callers merge them on top).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from qdeploy.graph.light import inferred_model
from qdeploy.graph.names import all_nodes
from qdeploy.graph.utils import node_readers

if TYPE_CHECKING:
    import onnx

__all__ = ["DEFAULT_HIGH", "INTEGER_TYPES", "PASS_THROUGH", "SIZE_HIGH", "Ranges", "safe_integer_ranges"]

INTEGER_TYPES = (2, 3, 4, 5, 6, 7, 12, 13)
"""ONNX element types of the integers: uint8, int8, uint16, int16, int32, int64, uint32, uint64."""
SIZE_HIGH = 4
"""Integers that become sizes, counts or shapes get values in [1, SIZE_HIGH)."""

PASS_THROUGH = frozenset({"Cast", "Identity", "Unsqueeze", "Squeeze", "Reshape", "Flatten", "Expand", "Abs",
                          "Neg", "Concat", "Slice", "Gather"})
"""Ops that carry an integer input's values (or some of them) on to the op that uses them."""
ARITHMETIC = frozenset({"Add", "Mul"})
"""Ops that carry an integer input's values on when every operand they read depends on that input: tf2onnx writes
Keras' embedding lookup (GatherV2) as ``x * (x >= 0) + (x < 0) * (x + n)`` in Mul and Add of comparison masks, which
is ``x`` itself for the non-negative values random data draws (slovorez); ``x + 2`` (an offset) is not carried."""
INDEX_OPS = {"Gather": 1, "GatherElements": 1, "GatherND": 1, "ScatterElements": 1, "ScatterND": 1}
"""Op -> input position of its indices into input 0."""
SIZE_INPUTS = {
    "Tile": (1,), "Expand": (1,), "Reshape": (1,), "ConstantOfShape": (0,), "Range": (0, 1, 2), "Resize": (3,),
    "Upsample": (1,), "OneHot": (1,), "TopK": (1,), "Pad": (1,), "Slice": (1, 2, 3, 4), "Split": (1,),
    "ReduceSum": (1,), "ReduceMean": (1,), "ReduceMax": (1,), "ReduceMin": (1,), "ReduceProd": (1,),
    "Squeeze": (1,), "Unsqueeze": (1,), "CenterCropPad": (1,), "Col2Im": (1, 2), "Trilu": (1,),
    "RandomNormalLike": (0,), "EyeLike": (0,), "Multinomial": (0,), "Loop": (0,), "NonMaxSuppression": (2,),
    "MaxUnpool": (2,), "STFT": (1, 2, 3), "DFT": (2,), "BlackmanWindow": (0,), "HannWindow": (0,),
    "HammingWindow": (0,), "MelWeightMatrix": (0, 1, 2), "RoiAlign": (2,), "SplitToSequence": (1,),
    "ReverseSequence": (1,), "CumSum": (1,), "Compress": (1,), "Bernoulli": (0,),
}
"""Op -> input positions that are sizes, counts, shapes, axes or lengths."""
DEFAULT_HIGH = 100
"""The high of an integer that is neither an index nor a size."""

Ranges = dict[str, tuple[float | None, float | None]]
"""Input name -> (low, high) of its seeded random values."""


def safe_integer_ranges(model: onnx.ModelProto, *, unknown: tuple[int, int] | None = (0, DEFAULT_HIGH)) -> Ranges:
    """[low, high) for every integer graph input, by what its values become (see the module's notes); an input
    the graph says nothing of (neither an index into a table nor a size) gets ``unknown``, or no entry when None."""
    graph = model.graph
    tables = _static_inputs(graph)
    tables.update((init.name, list(init.dims)) for init in graph.initializer)
    consumers = node_readers(all_nodes(graph))
    tables = _Tables(model, tables)
    ranges: Ranges = {}
    initializers = {init.name for init in graph.initializer}
    for value in graph.input:
        elem = value.type.tensor_type.elem_type if value.type.HasField("tensor_type") else 0
        if elem not in INTEGER_TYPES or value.name in initializers:  # integer types
            continue
        rows, size = _uses(value.name, consumers, tables)
        if rows is not None:
            ranges[value.name] = (0, max(rows, 1))
        elif size:
            ranges[value.name] = (1, SIZE_HIGH)
        elif unknown is not None:
            ranges[value.name] = unknown
    return ranges


def _static_inputs(graph: onnx.GraphProto) -> dict[str, list[int]]:
    """Graph inputs whose dimensions are all static: tables that gather indices must stay within too."""
    tables = {}
    for value in graph.input:
        if value.type.HasField("tensor_type") and value.type.tensor_type.HasField("shape"):
            dims = value.type.tensor_type.shape.dim
            if dims and all(dim.HasField("dim_value") and dim.dim_value > 0 for dim in dims):
                tables[value.name] = [dim.dim_value for dim in dims]
    return tables


class _Tables:
    """Tensor -> dimensions of the tables indices may select from: constants and static inputs first, then (read
    once, when first asked) the shapes ONNX's shape inference gives, a symbolic or unknown axis as 1."""

    def __init__(self, model: onnx.ModelProto, static: dict[str, list[int]]) -> None:
        self._model, self._static, self._inferred = model, static, None

    def get(self, name: str) -> list[int] | None:
        if name in self._static:
            return self._static[name]
        if self._inferred is None:
            self._inferred = _inferred_dims(self._model)
        return self._inferred.get(name)


def _inferred_dims(model: onnx.ModelProto) -> dict[str, list[int]]:
    """Tensor -> dimensions from shape inference (declared ones where it fails), symbolic and unknown axes as 1."""
    inferred = inferred_model(model).graph
    dims = {}
    for value in (*inferred.input, *inferred.value_info, *inferred.output):
        tensor = value.type.tensor_type
        if value.type.HasField("tensor_type") and tensor.HasField("shape") and tensor.shape.dim:
            dims[value.name] = [dim.dim_value if dim.HasField("dim_value") and dim.dim_value > 0 else 1
                                for dim in tensor.shape.dim]
    return dims


def _uses(name: str, consumers: dict[str, list[onnx.NodeProto]], tables: _Tables) -> tuple[int | None, bool]:
    """(rows of the smallest constant table it indexes, whether it becomes a size) of an integer tensor."""
    rows: list[int] = []
    size = False
    dependent = _depending_on(name, consumers)
    frontier, seen = [name], set()
    while frontier:
        current = frontier.pop()
        seen.add(current)
        for node in consumers.get(current, []):
            positions = [index for index, read in enumerate(node.input) if read == current]
            index_at = INDEX_OPS.get(node.op_type)
            table = tables.get(node.input[0]) if index_at in positions else None
            if table:
                axis = next((attr.i for attr in node.attribute if attr.name == "axis"), 0)
                rows.append(table[axis])
            if set(positions) & set(SIZE_INPUTS.get(node.op_type, ())):
                size = True
            if _carries(node, positions, dependent):
                frontier.extend(out for out in node.output if out and out not in seen)
    return (min(rows) if rows else None), size


def _carries(node: onnx.NodeProto, positions: list[int], dependent: set[str]) -> bool:
    """Whether ``node`` passes on (some of) the values it reads at ``positions``."""
    if node.op_type in PASS_THROUGH:
        return 0 in positions or node.op_type == "Concat"
    if node.op_type == "Where":  # a branch, not the condition
        return bool({1, 2} & set(positions))
    return node.op_type in ARITHMETIC and all(read in dependent for read in node.input if read)


def _depending_on(name: str, consumers: dict[str, list[onnx.NodeProto]]) -> set[str]:
    """Every tensor computed from ``name``, through any op."""
    found, frontier = {name}, [name]
    while frontier:
        for node in consumers.get(frontier.pop(), []):
            for out in node.output:
                if out and out not in found:
                    found.add(out)
                    frontier.append(out)
    return found
