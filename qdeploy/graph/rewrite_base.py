"""What a graph rewrite is and what it edits through: ``Replacement``, the ``@rewrite`` registry, ``GraphView``.

The rules (``qdeploy.graph.rewrite_rules``) register themselves here; ``qdeploy.graph.rewrites`` applies them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np
    import onnx

__all__ = ["FLOAT_TYPES", "REGISTRY", "GraphView", "Replacement", "Rewrite", "RewriteFn", "rewrite"]

log = logging.getLogger(__name__)

FLOAT_TYPES = frozenset({1, 10, 11})  # float, float16, double: numpy computes them exactly as stored


@dataclass
class Replacement:
    """What a matched rewrite puts in place of ``remove``."""

    remove: list[onnx.NodeProto]
    add: list[onnx.NodeProto]
    initializers: list[onnx.TensorProto] = field(default_factory=list)


RewriteFn = Callable[["GraphView", "onnx.NodeProto"], "Replacement | str | None"]


@dataclass(frozen=True)
class Rewrite:
    """A registered rewrite: its name (the recipe's word for it), the op it starts from, what it does."""

    name: str
    anchors: tuple[str, ...]
    """Op types it is tried on."""
    description: str
    default: bool
    computes_constants: bool
    """It computes new weights (a kind of folding): off when simplify's fold_constants is false."""
    fn: RewriteFn


REGISTRY: dict[str, Rewrite] = {}


def rewrite(name: str, *, anchor: str | tuple[str, ...], description: str, default: bool = False,
            computes_constants: bool = False) -> Callable[[RewriteFn], RewriteFn]:
    """Register ``fn`` as the rewrite ``name``, tried on every node of op type ``anchor`` (or of one of them)."""

    def register(fn: RewriteFn) -> RewriteFn:
        if name in REGISTRY:
            raise ValueError(f"rewrite '{name}' is registered twice")
        anchors = (anchor,) if isinstance(anchor, str) else tuple(anchor)
        REGISTRY[name] = Rewrite(name, anchors, description, default, computes_constants, fn)
        return fn

    return register



class GraphView:
    """An index over a graph's top level: producers, consumers, constants; edits through ``apply``."""

    def __init__(self, model: onnx.ModelProto) -> None:
        self.model = model
        self.graph = model.graph
        self.opset = next((entry.version for entry in model.opset_import if entry.domain in ("", "ai.onnx")), 0)
        overridable = {value.name for value in self.graph.input} if model.ir_version >= 4 else set()
        self.initializers = {init.name: init for init in self.graph.initializer if init.name not in overridable}
        self.outputs = {value.name for value in self.graph.output}
        self.producer: dict[str, onnx.NodeProto] = {}
        self.consumers: dict[str, list[onnx.NodeProto]] = {}
        self._names: set[str] = set()
        self._values: dict[str, onnx.ValueInfoProto] | None = None
        self._reindex()

    def _reindex(self) -> None:
        from qdeploy.graph.utils import subgraph_references

        self.producer.clear()
        self.consumers.clear()
        for node in self.graph.node:
            self.producer.update((name, node) for name in node.output if name)
            for name in node.input:
                self.consumers.setdefault(name, []).append(node)
        self._outer_reads = subgraph_references(self.graph)
        self._names = set(self.producer) | set(self.consumers) | set(self.initializers) | self.outputs | {
            value.name for value in self.graph.input}

    def constant(self, name: str) -> np.ndarray | None:
        """The value of a non-overridable initializer; None for anything computed or fed."""
        from onnx import numpy_helper

        init = self.initializers.get(name)
        return None if init is None else numpy_helper.to_array(init)

    def constant_type(self, name: str) -> int | None:
        init = self.initializers.get(name)
        return None if init is None else init.data_type

    def value_info(self, name: str) -> onnx.ValueInfoProto | None:
        """The declared or inferred type of a top-level tensor (an index built on first use)."""
        if self._values is None:
            graph = self.graph
            self._values = {value.name: value for value in (*graph.input, *graph.value_info, *graph.output)}
        return self._values.get(name)

    def sole_consumer(self, name: str) -> onnx.NodeProto | None:
        """The one node reading ``name``, when nothing else (graph output, subgraph) reads it."""
        readers = self.consumers.get(name, [])
        if len(readers) != 1 or name in self.outputs or name in self._outer_reads:
            return None
        return readers[0]

    def fresh(self, base: str) -> str:
        """A tensor or node name not used anywhere in the graph."""
        candidate, index = base, 0
        while candidate in self._names:
            index += 1
            candidate = f"{base}_{index}"
        self._names.add(candidate)
        return candidate

    def apply(self, replacements: list[Replacement]) -> None:
        """Remove the replaced nodes and insert their replacements where the first removed node stood."""
        if not replacements:
            return
        removed = {id(node): index for index, repl in enumerate(replacements) for node in repl.remove}
        inserted: set[int] = set()
        nodes: list[onnx.NodeProto] = []
        for node in self.graph.node:
            index = removed.get(id(node))
            if index is None:
                nodes.append(node)
            elif index not in inserted:
                inserted.add(index)
                nodes.extend(replacements[index].add)
        del self.graph.node[:]
        self.graph.node.extend(nodes)
        for repl in replacements:
            self.graph.initializer.extend(repl.initializers)
            self.initializers.update((init.name, init) for init in repl.initializers)
        self._reindex()
        self._drop_unread({name for repl in replacements for node in repl.remove for name in node.input})

    def _drop_unread(self, candidates: set[str]) -> None:
        """Initializers that only the replaced nodes read (old weights) go with them."""
        from qdeploy.graph.utils import delete_where

        inputs = {value.name for value in self.graph.input}
        unread = {name for name in candidates if name in self.initializers and name not in self.consumers
                  and name not in self.outputs and name not in self._outer_reads and name not in inputs}
        if not unread:
            return
        delete_where(self.graph.initializer, lambda init: init.name in unread)
        for name in unread:
            del self.initializers[name]


