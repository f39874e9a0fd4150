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
holds the registry).

Rewrites edit the top-level graph through ``qdeploy.graph.edit`` (onnx-ir:
producers, uses, constants, fresh names), the editor fake-quant lowering uses
too, never by protobuf index; the edits are written back into the model's
own message.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypedDict

from qdeploy.graph import rewrite_rules  # noqa: F401  (its ``@rewrite`` decorators fill the registry)
from qdeploy.graph.edit import AI_ONNX_DOMAINS, GraphEditor, editing
from qdeploy.graph.rewrite_base import REGISTRY, Replacement, Rewrite, rewrite

if TYPE_CHECKING:
    import onnx
    import onnx_ir as ir

log = logging.getLogger(__name__)

__all__ = ["GraphEditor", "Replacement", "Rewrite", "RewriteOutcome", "RewriteReport", "apply_rewrites", "available",
           "default_names", "rewrite"]

def available() -> dict[str, Rewrite]:
    """Every registered rewrite by name."""
    return dict(REGISTRY)


def default_names() -> list[str]:
    return [name for name, rule in available().items() if rule.default]




class RewriteOutcome(TypedDict):
    """``RewriteReport.as_findings()`` (the simplify findings' ``rewrites``)."""

    applied: dict[str, int]
    refused: dict[str, dict[str, str]]


@dataclass
class RewriteReport:
    """Per rewrite: how many matches it rewrote, and the reasons it refused others."""

    applied: Counter[str] = field(default_factory=Counter)
    refused: dict[str, dict[str, str]] = field(default_factory=dict)
    """rewrite -> node name -> reason (the first few of each rewrite)."""

    def as_findings(self) -> RewriteOutcome:
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
        return 0  # nothing to match: no onnx-ir view to build
    with editing(model) as edit:
        return _apply(edit, by_anchor, report)


def _apply(edit: GraphEditor, by_anchor: dict[str, list[Rewrite]], report: RewriteReport) -> int:
    """Rounds over the graph until none rewrites anything; returns how many matches were rewritten."""
    total = 0
    todo = list(edit.graph)
    for _ in range(len(todo) + 1):  # every round rewrites at least one node
        added = _apply_round(edit, todo, by_anchor, report)
        total += len(added)
        if not added:
            break
        # A rewrite changes nothing around the nodes it does not touch: the next round looks at the new ones only.
        todo = [node for node in added if node.graph is edit.graph]
    return total


def _apply_round(edit: GraphEditor, todo: list[ir.Node], by_anchor: dict[str, list[Rewrite]],
                 report: RewriteReport) -> list[ir.Node]:
    """One pass over ``todo``, each match replaced at once; the nodes the replacements added."""
    added: list[ir.Node] = []
    for node in todo:
        if node.graph is not edit.graph or node.op_type not in by_anchor or node.domain not in AI_ONNX_DOMAINS:
            continue  # removed by an earlier match of this pass, or not an anchor
        for rule in by_anchor[node.op_type]:
            outcome = rule.fn(edit, node)
            if isinstance(outcome, str):
                refusals = report.refused.setdefault(rule.name, {})
                if len(refusals) < MAX_REFUSALS_REPORTED:
                    refusals[node.name or node.outputs[0].name or node.op_type] = outcome
                continue
            if outcome is None:
                continue
            _replace(edit, outcome)
            added.extend(outcome.add)
            report.applied[rule.name] += 1
            break
    return added


def _replace(edit: GraphEditor, replacement: Replacement) -> None:
    edit.replace(replacement.remove, replacement.add, replacement.replaces, replacement.add[-1].outputs[0])
