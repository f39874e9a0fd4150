"""What every lowering rule is made of, and the graph edits they share.

A rule is a ``pattern`` (a node -> a ``Match`` or None), an optional ``check``
(a match -> the reason it is refused, or None) and a ``replacement`` (a match
and the graph editor -> the record of what it did).  Rules read and edit the
graph through ``qdeploy.graph.edit.GraphEditor`` (onnx-ir: producers, uses,
replace-all-uses), the editor graph rewrites use too, never through protobuf
indices.  The package (``qdeploy.stages.quantize.lower``) assembles the rules and applies them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypedDict

import numpy as np

from qdeploy.graph.edit import GraphEditor
from qdeploy.stages.quantize.lower._grid import AffineFakeQuant, Reference, exact_qdq, fold_weight, max_difference

if TYPE_CHECKING:
    import onnx_ir as ir


class SiteRecord(TypedDict, total=False):
    """What a replacement did at one site (``findings.sites[]``): the rule, the nodes, and how exact it is."""

    rule: str
    nodes: list[str]
    tensor: str | None
    kind: str
    """``weight`` (folded into an integer initializer), ``activation`` (Q then DQ) or ``observer``."""
    dtype: str
    per_channel: bool
    levels: int
    symmetric: bool
    notes: list[str]
    step: float
    max_difference: float
    exact: bool
    rounding_error_steps: float
    scale: list[float]
    """An observer's first scales."""


@dataclass
class Match:
    """Nodes a pattern matched (the anchor first), its data input and the value it produces."""

    nodes: list[ir.Node]
    x: ir.Value
    y: ir.Value
    constants: dict[str, np.ndarray | None] = field(default_factory=dict)
    """Constant inputs the pattern read (None where the input is computed at run time)."""
    attributes: dict[str, Any] = field(default_factory=dict)

    @property
    def names(self) -> list[str]:
        return [node.name or node.op_type for node in self.nodes]


def accept(match: Match) -> str | None:
    """The default check: every match is accepted."""
    return None


@dataclass(frozen=True)
class Rule:
    """A rewrite: pattern, replacement, and an optional check returning why a match was refused."""

    name: str
    pattern: Callable[[ir.Node], Match | None]
    replacement: Callable[[Match, LoweringEditor], SiteRecord]
    check: Callable[[Match], str | None] = accept


@dataclass(frozen=True)
class ActivationCheck:
    """A lowered activation fake-quant to verify on data: y must equal reference(x) within the bound."""

    x: str
    y: str
    reference: Reference
    step: float
    max_difference: float
    rule: str


def missing_constants(match: Match, names: tuple[str, ...]) -> str | None:
    """A refusal naming the inputs that are computed at run time instead of being constants."""
    missing = [name for name in names if match.constants.get(name) is None]
    if missing:
        return f"{', '.join(missing)} computed at run time, not constant"
    return None


def single_use(value: ir.Value) -> bool:
    """The value feeds exactly one node input and is not a graph output."""
    return len(value.uses()) == 1 and not value.is_graph_output()


def only_consumer(value: ir.Value) -> ir.Node | None:
    return value.uses()[0].node if single_use(value) else None


class LoweringEditor(GraphEditor):
    """The shared graph editor (``qdeploy.graph.edit``) plus what lowering adds: Q/DQ emission, data checks."""

    def __init__(self, graph: ir.Graph) -> None:
        super().__init__(graph)
        self.checks: list[ActivationCheck] = []

    def replace_match(self, match: Match, new_nodes: list[ir.Node], new_value: ir.Value) -> None:
        """Put new_nodes in place of the matched nodes; new_value takes over the matched output's uses and name."""
        self.replace(match.nodes, new_nodes, match.y, new_value)

    def lower_fake_quant(self, match: Match, rule: str, fake_quant: AffineFakeQuant,
                         reference: Reference) -> SiteRecord:
        """Replace a matched fake-quant by its exact Q/DQ form: a folded int8 weight, or Q then DQ."""
        qdq = exact_qdq(fake_quant)
        weight = self.constant(match.x)
        base = match.y.name or "fq"
        record: SiteRecord = {"rule": rule, "nodes": match.names, "tensor": match.y.name,
                                  "per_channel": qdq.axis is not None, "levels": fake_quant.levels,
                                  "notes": list(qdq.notes)}
        if weight is not None:
            data, scale, zero, difference = fold_weight(np.asarray(reference(weight.astype(np.float64))), qdq)
            inputs = [self.initializer(f"{base}_quantized", data), self.initializer(f"{base}_scale", scale),
                      self.initializer(f"{base}_zero_point", zero)]
            dq = self._node("DequantizeLinear", inputs, qdq.axis, weight.ndim, f"{base}_DequantizeLinear")
            self.replace_match(match, [dq], dq.outputs[0])
            record.update(kind="weight", dtype="int8", symmetric=bool(np.all(zero == 0)),
                          notes=[note for note in qdq.notes if not note.startswith("narrow range")])
        else:
            difference = max_difference(reference, fake_quant, qdq)
            nodes = self._qdq_nodes(match.x, qdq, base)
            self.replace_match(match, nodes, nodes[-1].outputs[0])
            self.checks.append(ActivationCheck(match.x.name or "", match.y.name or "", reference, qdq.step,
                                               difference, rule))
            record.update(kind="activation", dtype=str(qdq.dtype))
        record.update(step=qdq.step, max_difference=difference, exact=difference == 0.0)
        return record

    def _qdq_nodes(self, x: ir.Value, qdq: Any, base: str) -> list[ir.Node]:
        rank = len(x.shape) if x.shape is not None else None
        q_inputs = [x, self.initializer(f"{base}_scale", qdq.q_scale), self.initializer(f"{base}_zero_point",
                                                                                           qdq.q_zero)]
        quantize = self._node("QuantizeLinear", q_inputs, qdq.axis, rank, f"{base}_QuantizeLinear")
        if qdq.same_params:
            dq_params = q_inputs[1:]
        else:
            dq_params = [self.initializer(f"{base}_dq_scale", qdq.dq_scale),
                         self.initializer(f"{base}_dq_zero_point", qdq.dq_zero)]
        dequantize = self._node("DequantizeLinear", [quantize.outputs[0], *dq_params], qdq.axis, rank,
                                f"{base}_DequantizeLinear")
        return [quantize, dequantize]

    def _node(self, op_type: str, inputs: list[ir.Value], axis: int | None, rank: int | None,
              name: str) -> ir.Node:
        import onnx_ir as ir

        attributes = {}
        if axis is not None:
            attributes["axis"] = axis + rank if rank is not None else axis
        node = ir.node(op_type, inputs, attributes, name=self.fresh_name(name))
        node.outputs[0].name = self.fresh_name(f"{name}_output")
        return node
