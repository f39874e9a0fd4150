"""What every simplification pass must leave alone: the types of each graph's inputs and outputs, and scope.

onnxoptimizer rebuilds graph inputs and outputs from its own IR, which has no
sequence, optional or map types: ``onnxoptimizer.optimize(m, [])`` alone turns a
``seq(tensor(float))`` input into one without type, and ONNX Runtime then
refuses the model ("Model input (x) does not have type information").  After
each pass the types are compared by name in every graph (subgraphs' inputs and
outputs too, a Loop's carried sequences): a type that was lost is put back; a
type that changed into another is a conflict and the pass's result is refused.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from qdeploy.graph.utils import subgraphs
from qdeploy.stages.simplify._check_inputs import type_signature

if TYPE_CHECKING:
    import onnx


@dataclass
class InterfaceTypeRepair:
    """What restoring the interface types found."""

    restored: list[str] = field(default_factory=list)
    """'name: lost -> restored' of each graph input/output whose type a pass had dropped."""
    conflicts: list[str] = field(default_factory=list)
    """'name: before -> after' of each whose type a pass changed into another."""


def _interface_values(graph: onnx.GraphProto) -> Iterator[onnx.ValueInfoProto]:
    """The inputs and outputs of ``graph`` and of every subgraph below it."""
    yield from graph.input
    yield from graph.output
    for node in graph.node:
        for sub in subgraphs(node):
            yield from _interface_values(sub)


def interface_types(model: onnx.ModelProto) -> dict[str, onnx.TypeProto]:
    """Name -> declared type of every graph input and output, subgraphs included (a copy)."""
    import onnx

    types: dict[str, onnx.TypeProto] = {}
    ambiguous: set[str] = set()  # two subgraphs may reuse a name with other types: left alone
    for value in _interface_values(model.graph):
        if not value.type.WhichOneof("value"):
            continue
        if value.name in types and types[value.name] != value.type:
            ambiguous.add(value.name)
        copy = onnx.TypeProto()
        copy.CopyFrom(value.type)
        types.setdefault(value.name, copy)
    return {name: kind for name, kind in types.items() if name not in ambiguous}


def restore_interface_types(model: onnx.ModelProto, before: dict[str, onnx.TypeProto]) -> InterfaceTypeRepair:
    """Put back the types a pass dropped from graph inputs/outputs of ``model``; list the ones it changed."""
    repair = InterfaceTypeRepair()
    for value in _interface_values(model.graph):
        old = before.get(value.name)
        if old is None:
            continue
        was, now = type_signature(old), type_signature(value.type)
        if was == now:
            if _rank(value.type) is None and _rank(old) is not None:
                value.type.CopyFrom(old)  # the same type, its shape lost: put the shape back
            continue
        if _less_known(now, was):
            value.type.CopyFrom(old)
            repair.restored.append(f"{value.name}: {now} -> {was}")
        else:
            repair.conflicts.append(f"{value.name}: {was} -> {now}")
    return repair


def _less_known(now: str, was: str) -> bool:
    """Whether ``now`` is ``was`` with parts unknown ('?' where ``was`` says more)."""
    if now == "?":
        return True
    if "?" not in now or len(now) > len(was):
        return False
    head, _, tail = now.partition("?")
    return was.startswith(head) and was.endswith(tail)


def _rank(type_proto: onnx.TypeProto) -> int | None:
    if type_proto.WhichOneof("value") != "tensor_type" or not type_proto.tensor_type.HasField("shape"):
        return None
    return len(type_proto.tensor_type.shape.dim)
