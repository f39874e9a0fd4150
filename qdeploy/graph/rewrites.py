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

The rules themselves live in ``qdeploy.graph.rewrite_rules``; this module is the
entry point: the registered rules by name and the loop that applies them (``qdeploy.graph.rewrite_base``
holds the registry and the graph view they edit through).

Rewrites edit the top-level graph through ``GraphView`` (producers, consumers,
constants, fresh names), never by protobuf index.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from qdeploy.graph import rewrite_rules  # noqa: F401  (its ``@rewrite`` decorators fill the registry)
from qdeploy.graph.rewrite_base import REGISTRY, GraphView, Replacement, Rewrite, rewrite

if TYPE_CHECKING:
    import onnx

log = logging.getLogger(__name__)

__all__ = ["GraphView", "Replacement", "Rewrite", "RewriteReport", "apply_rewrites", "available", "default_names",
           "rewrite"]

def available() -> dict[str, Rewrite]:
    """Every registered rewrite by name."""
    return dict(REGISTRY)


def default_names() -> list[str]:
    return [name for name, rule in available().items() if rule.default]




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
