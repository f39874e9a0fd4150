"""Inputs for a stage's self-check that cannot hurt: safe integer values, a memory bound, plain tensors only.

Random integers are dangerous in a check: an integer input may become Tile
repeats, Pad widths, a Range limit, a shape or gather indices, and 0..99 there
asked ONNX Runtime for 16 GB.  So an integer input takes
- the ``low``/``high`` the recipe's ``model.inputs`` gives, else
- [0, rows) when it indexes a constant table (Gather, GatherElements, GatherND, through value-preserving ops), else
- [1, SIZE_HIGH) when it becomes a size, a count or a shape (Tile, Expand, Reshape, ConstantOfShape, Range,
  Resize, OneHot, TopK, Pad, Slice, Split, ...), else
- [0, 100);
and when the model compares an integer input with constants (``Equal(sr, 16000)`` choosing a branch), the
first samples take those values, one each, so that the check reaches the branches they select.
And every run of the check happens under ``bounded_memory``: the process's address space may grow by at most
``CHECK_MEMORY_BYTES`` (Linux; elsewhere unbounded); beyond it ONNX Runtime's allocation fails with an error the
check reports as "unchecked" instead of the kernel killing the process.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from qdeploy.graph.utils import node_readers, subgraphs

if TYPE_CHECKING:
    import numpy as np
    import onnx

log = logging.getLogger(__name__)

CHECK_MEMORY_BYTES = int(float(os.environ.get("QDEPLOY_CHECK_MEMORY_GB", "4")) * 2**30)
"""How much the process may grow while a check runs (QDEPLOY_CHECK_MEMORY_GB, default 4)."""
SIZE_HIGH = 4
"""Integers that become sizes, counts or shapes get values in [1, SIZE_HIGH)."""

PASS_THROUGH = frozenset({"Cast", "Identity", "Unsqueeze", "Squeeze", "Reshape", "Flatten", "Expand", "Abs",
                          "Neg", "Concat", "Slice", "Gather"})
"""Ops that carry an integer input's values (or some of them) on to the op that uses them."""
INDEX_OPS = {"Gather": 1, "GatherElements": 1, "GatherND": 1}
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


def unfeedable_inputs(model: onnx.ModelProto) -> list[str]:
    """'name (type)' of every graph input a check cannot build: sequences, optionals, maps, strings."""
    initializers = {init.name for init in model.graph.initializer}
    problems = []
    for value in model.graph.input:
        if value.name in initializers:
            continue
        kind = value.type.WhichOneof("value")
        if kind != "tensor_type" or value.type.tensor_type.elem_type in (0, 8):
            problems.append(f"'{value.name}' ({type_signature(value.type)})")
    return problems


def type_signature(type_proto: onnx.TypeProto) -> str:
    """'tensor(float)', 'seq(tensor(int64))', 'optional(seq(tensor(float)))', ... ('?' where nothing is known)."""
    from onnx import TensorProto

    kind = type_proto.WhichOneof("value")
    if kind in ("tensor_type", "sparse_tensor_type"):
        elem = getattr(type_proto, kind).elem_type
        name = TensorProto.DataType.Name(elem).lower() if elem else "?"  # as ONNX Runtime names them
        return f"{'sparse_' if kind == 'sparse_tensor_type' else ''}tensor({name})"
    if kind == "sequence_type":
        return f"seq({type_signature(type_proto.sequence_type.elem_type)})"
    if kind == "optional_type":
        return f"optional({type_signature(type_proto.optional_type.elem_type)})"
    if kind == "map_type":
        return f"map({type_proto.map_type.key_type},{type_signature(type_proto.map_type.value_type)})"
    return "?"


Ranges = dict[str, tuple[float | None, float | None]]


def safe_integer_ranges(model: onnx.ModelProto) -> Ranges:
    """[low, high) for every integer graph input, by what its values become (see the module's notes)."""
    graph = model.graph
    tables = _static_inputs(graph)
    tables.update((init.name, list(init.dims)) for init in graph.initializer)
    consumers = node_readers(_all_nodes(graph))
    ranges: Ranges = {}
    initializers = {init.name for init in graph.initializer}
    for value in graph.input:
        elem = value.type.tensor_type.elem_type if value.type.HasField("tensor_type") else 0
        if elem not in (2, 3, 4, 5, 6, 7, 12, 13) or value.name in initializers:  # integer types
            continue
        rows, size = _uses(value.name, consumers, tables)
        if rows is not None:
            ranges[value.name] = (0, max(rows, 1))
        elif size:
            ranges[value.name] = (1, SIZE_HIGH)
        else:
            ranges[value.name] = (0, DEFAULT_HIGH)
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


def _all_nodes(graph: onnx.GraphProto) -> Iterator[onnx.NodeProto]:
    for node in graph.node:
        yield node
        for sub in subgraphs(node):
            yield from _all_nodes(sub)


def _uses(name: str, consumers: dict[str, list[onnx.NodeProto]],
          tables: dict[str, list[int]]) -> tuple[int | None, bool]:
    """(rows of the smallest constant table it indexes, whether it becomes a size) of an integer tensor."""
    rows: list[int] = []
    size = False
    frontier, seen = [name], set()
    while frontier:
        current = frontier.pop()
        seen.add(current)
        for node in consumers.get(current, []):
            positions = [index for index, read in enumerate(node.input) if read == current]
            index_at = INDEX_OPS.get(node.op_type)
            if index_at in positions and node.input[0] in tables and tables[node.input[0]]:
                axis = next((attr.i for attr in node.attribute if attr.name == "axis"), 0)
                rows.append(tables[node.input[0]][axis])
            if set(positions) & set(SIZE_INPUTS.get(node.op_type, ())):
                size = True
            if node.op_type in PASS_THROUGH and (0 in positions or node.op_type == "Concat"):
                frontier.extend(out for out in node.output if out and out not in seen)
    return (min(rows) if rows else None), size


COMPARISONS = frozenset({"Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual"})
MAX_COMPARED = 4


def compared_values(model: onnx.ModelProto) -> dict[str, list[int]]:
    """Integer graph input -> the constant scalars it is compared with (through value-preserving ops)."""
    from onnx import numpy_helper

    graph = model.graph
    constants = {init.name: init for init in graph.initializer}
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for node in _all_nodes(graph):
        if node.op_type == "Constant" and len(node.attribute) == 1 and node.attribute[0].HasField("t"):
            constants[node.output[0]] = node.attribute[0].t
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    found: dict[str, list[int]] = {}
    for value in graph.input:
        elem = value.type.tensor_type.elem_type if value.type.HasField("tensor_type") else 0
        if elem not in (2, 3, 4, 5, 6, 7, 12, 13) or value.name in constants:
            continue
        values: set[int] = set()
        for node in _reached(value.name, consumers):
            if node.op_type in COMPARISONS:
                others = [constants[name] for name in node.input if name in constants]
                values.update(int(v) for tensor in others for v in numpy_helper.to_array(tensor).reshape(-1)[:2])
        if values:
            found[value.name] = sorted(values)[:MAX_COMPARED]
    return found


def _reached(name: str, consumers: dict[str, list[onnx.NodeProto]]) -> Iterator[onnx.NodeProto]:
    """The nodes that read ``name`` or what value-preserving ops make of it."""
    frontier, seen = [name], set()
    while frontier:
        current = frontier.pop()
        seen.add(current)
        for node in consumers.get(current, []):
            yield node
            if node.op_type in PASS_THROUGH and node.input and node.input[0] == current:
                frontier.extend(out for out in node.output if out and out not in seen)


def with_compared_values(samples: Any, choices: dict[str, list[int]]) -> Iterator[dict[str, np.ndarray]]:
    """The samples, the first ones taking each compared constant of an input in turn (the rest stay random)."""
    import numpy as np

    for index, sample in enumerate(samples):
        for name, values in choices.items():
            if index < len(values) and name in sample:
                sample[name] = np.full_like(sample[name], values[index])
        yield sample


@contextlib.contextmanager
def bounded_memory(extra_bytes: int = CHECK_MEMORY_BYTES) -> Iterator[None]:
    """Let the process's address space grow by at most ``extra_bytes`` inside the block (Linux).

    An allocation past it fails (ONNX Runtime raises, numpy raises MemoryError) instead of the kernel killing
    the process.  The previous limit comes back afterwards.
    """
    try:
        import resource
    except ImportError:  # not on this platform: unbounded
        yield
        return
    current = _address_space()
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    if current is None or extra_bytes <= 0:
        yield
        return
    wanted = current + extra_bytes
    if soft != resource.RLIM_INFINITY:
        wanted = min(wanted, soft)
    if hard != resource.RLIM_INFINITY:
        wanted = min(wanted, hard)
    try:
        resource.setrlimit(resource.RLIMIT_AS, (wanted, hard))
    except (ValueError, OSError):  # not allowed here: unbounded
        yield
        return
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def _address_space() -> int | None:
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmSize:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def is_memory_error(exc: BaseException) -> bool:
    """Whether a failure looks like the memory bound (or any allocation failure) rather than a model problem."""
    text = str(exc).lower()
    return isinstance(exc, MemoryError) or any(word in text for word in ("bad_alloc", "bfc_arena", "out of memory",
                                                                          "failed to allocate", "cannot allocate"))


def recipe_samples(ctx: Any, model_path: Any, count: int) -> list[dict[str, np.ndarray]]:
    """Up to ``count`` samples of the recipe's validation dataset (real data), or [] when it has none or they do
    not fit the model."""
    dataset = ctx.default_dataset
    if not dataset:
        return []
    try:
        return list(ctx.samples(dataset, model_path, count))
    except Exception as exc:  # data that does not fit is validation's error to report, not the check's
        log.info("the check does not use dataset '%s': %s", dataset, exc)
        return []
