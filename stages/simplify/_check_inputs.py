"""Inputs for a stage's self-check that cannot hurt: safe integer values, a memory bound, plain tensors only.

Integer inputs take the recipe's ``model.inputs`` ``low``/``high``, else the safe ranges that
``qdeploy.graph.integer_inputs`` reads from the graph (every stage's random data takes the same ones); when the
model compares an integer input with constants (``Equal(sr, 16000)`` choosing a branch), the first samples take
those values, one each, so that the check reaches the branches they select.
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

from qdeploy.graph.integer_inputs import INTEGER_TYPES, PASS_THROUGH, safe_integer_ranges
from qdeploy.graph.names import all_nodes

if TYPE_CHECKING:
    import numpy as np
    import onnx

log = logging.getLogger(__name__)

__all__ = ["bounded_memory", "compared_values", "is_memory_error", "recipe_samples", "safe_integer_ranges",
           "type_signature", "unfeedable_inputs", "with_compared_values"]

CHECK_MEMORY_BYTES = int(float(os.environ.get("QDEPLOY_CHECK_MEMORY_GB", "4")) * 2**30)
"""How much the process may grow while a check runs (QDEPLOY_CHECK_MEMORY_GB, default 4)."""


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


COMPARISONS = frozenset({"Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual"})
MAX_COMPARED = 4


def compared_values(model: onnx.ModelProto) -> dict[str, list[int]]:
    """Integer graph input -> the constant scalars it is compared with (through value-preserving ops)."""
    from onnx import numpy_helper

    graph = model.graph
    constants = {init.name: init for init in graph.initializer}
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for node in all_nodes(graph):
        if node.op_type == "Constant" and len(node.attribute) == 1 and node.attribute[0].HasField("t"):
            constants[node.output[0]] = node.attribute[0].t
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    found: dict[str, list[int]] = {}
    for value in graph.input:
        elem = value.type.tensor_type.elem_type if value.type.HasField("tensor_type") else 0
        if elem not in INTEGER_TYPES or value.name in constants:
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
