"""Named graph rewrites that the simplify stage applies, selectable in the recipe (`simplify: {rewrites: [...]}`).

A rewrite is one small function registered with ``@rewrite``: given the graph
and a node of its anchor op type, it returns ``None`` (no match), a string
(matched but refused: the reason, reported in the findings) or a
``Replacement`` (nodes to remove, nodes and initializers that take their
place; the last new node produces the removed nodes' output names, so
consumers and graph outputs are untouched).  Two kinds exist:

- simplifications on by default (fusing per-channel scales, shifts and
  BatchNormalization into the Conv before them);
- target-friendly rewrites chosen by the recipe: PReLU to a Relu-based form,
  and decompositions of ops a target lacks into ops it has, as an exporter's
  op mapper does (HardSwish, Gelu, LayerNormalization).

The rules themselves live in ``stages.rewrite_rules``; this module is the
registry, the graph view they edit through, and the loop that applies them.

Rewrites edit the top-level graph through ``GraphView`` (producers, consumers,
constants, fresh names), never by protobuf index.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np
    import onnx

log = logging.getLogger(__name__)

_FLOAT_TYPES = frozenset({1, 10, 11})  # float, float16, double: numpy computes them exactly as stored


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


_REGISTRY: dict[str, Rewrite] = {}


def rewrite(name: str, *, anchor: str | tuple[str, ...], description: str, default: bool = False,
            computes_constants: bool = False) -> Callable[[RewriteFn], RewriteFn]:
    """Register ``fn`` as the rewrite ``name``, tried on every node of op type ``anchor`` (or of one of them)."""

    def register(fn: RewriteFn) -> RewriteFn:
        if name in _REGISTRY:
            raise ValueError(f"rewrite '{name}' is registered twice")
        anchors = (anchor,) if isinstance(anchor, str) else tuple(anchor)
        _REGISTRY[name] = Rewrite(name, anchors, description, default, computes_constants, fn)
        return fn

    return register


def available() -> dict[str, Rewrite]:
    """Every registered rewrite by name."""
    _load_rules()
    return dict(_REGISTRY)


def default_names() -> list[str]:
    return [name for name, rule in available().items() if rule.default]


def _load_rules() -> None:
    """Import the rule modules, whose ``@rewrite`` decorators fill the registry."""
    import stages.rewrite_rules  # noqa: F401


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
        from stages.graph_utils import subgraph_references

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
        from stages.graph_utils import delete_where

        inputs = {value.name for value in self.graph.input}
        unread = {name for name in candidates if name in self.initializers and name not in self.consumers
                  and name not in self.outputs and name not in self._outer_reads and name not in inputs}
        if not unread:
            return
        delete_where(self.graph.initializer, lambda init: init.name in unread)
        for name in unread:
            del self.initializers[name]


@dataclass
class RewriteReport:
    """Per rewrite: how many matches it rewrote, and the reasons it refused others."""

    applied: Counter[str] = field(default_factory=Counter)
    refused: dict[str, dict[str, str]] = field(default_factory=dict)
    """rewrite -> node name -> reason (the first few of each rewrite)."""

    def as_findings(self) -> dict[str, Any]:
        return {"applied": dict(self.applied), "refused": self.refused}


MAX_REFUSALS_REPORTED = 20


def apply_rewrites(model: onnx.ModelProto, names: list[str], report: RewriteReport) -> int:
    """Apply the named rewrites, in their order for each node, until none matches; returns how many matched."""
    rules = available()
    by_anchor: dict[str, list[Rewrite]] = {}
    for name in names:
        for anchor in rules[name].anchors:
            by_anchor.setdefault(anchor, []).append(rules[name])
    if not by_anchor or not any(node.op_type in by_anchor for node in model.graph.node):
        return 0
    view = GraphView(model)
    total = 0
    fresh: set[str] | None = None
    for _ in range(len(model.graph.node) + 1):  # every round rewrites at least one node
        replacements = _apply_round(view, by_anchor, report, fresh)
        total += len(replacements)
        if not replacements:
            break
        # A rewrite changes nothing around the nodes it does not touch: the next round looks at the new ones only.
        fresh = {name for repl in replacements for node in repl.add for name in node.output}
    return total


def _apply_round(view: GraphView, by_anchor: dict[str, list[Rewrite]], report: RewriteReport,
                 fresh: set[str] | None) -> list[Replacement]:
    """One pass over the graph (or over the nodes producing ``fresh`` names); the replacements it applied."""
    replacements: list[Replacement] = []
    claimed: set[int] = set()
    for node in list(view.graph.node):
        if node.op_type not in by_anchor or node.domain not in ("", "ai.onnx") or id(node) in claimed:
            continue
        if fresh is not None and not fresh.intersection(node.output):
            continue
        for rule in by_anchor[node.op_type]:
            outcome = rule.fn(view, node)
            if isinstance(outcome, str):
                refusals = report.refused.setdefault(rule.name, {})
                if len(refusals) < MAX_REFUSALS_REPORTED:
                    refusals[node.name or node.output[0]] = outcome
                continue
            if outcome is None or any(id(old) in claimed for old in outcome.remove):
                continue
            claimed.update(id(old) for old in outcome.remove)
            replacements.append(outcome)
            report.applied[rule.name] += 1
            break
    view.apply(replacements)
    return replacements
