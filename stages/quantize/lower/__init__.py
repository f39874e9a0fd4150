"""``quantize: {mode: lower}``: fake quantization lowered to QuantizeLinear/DequantizeLinear.

The rules (one place: ``DEFAULT_RULES``) run in order over every graph of the
model, subgraphs included.  Each lowered fake-quant becomes either an int8
weight initializer followed by DequantizeLinear (constant input) or a
QuantizeLinear/DequantizeLinear pair (activation), per axis where the source is
per channel.  Afterwards:

- fake-quant ops that no rule knows are reported by name and stop the stage
  (runtimes could not execute them);
- each lowered activation is checked on data: ONNX Runtime runs the lowered
  model and its Q/DQ output must equal the numpy reference of the original
  fake-quant, applied to the same input, within one quantization step (plus
  the difference the nearest exact form was reported to cause).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from qdeploy.core.errors import StageError
from qdeploy.graph.edit import AI_ONNX_DOMAINS
from qdeploy.graph.external_data import save_onnx
from qdeploy.stages.quantize.findings import ActivationMiss, LoweringNotes, LoweringVerification, RefusedSite
from qdeploy.stages.quantize.lower import _ops as quantize_lower_ops
from qdeploy.stages.quantize.lower import _patterns as quantize_lower_patterns
from qdeploy.stages.quantize.lower import _qdq as quantize_lower_qdq
from qdeploy.stages.quantize.lower._base import ActivationCheck, LoweringEditor, Rule, SiteRecord
from qdeploy.stages.quantize.lower._grid import Refused

if TYPE_CHECKING:
    from pathlib import Path

    import onnx
    import onnx_ir as ir

__all__ = ["DEFAULT_RULES", "MAX_SITES_LISTED", "MIN_OPSET", "STAGE", "Lowered", "lower_model",
           "unknown_fake_quant_ops", "verify_on_data"]

log = logging.getLogger(__name__)

STAGE = "quantize"
MIN_OPSET = 13
"""QuantizeLinear/DequantizeLinear with per-axis scales need opset 13."""
MAX_SITES_LISTED = 200

DEFAULT_RULES: tuple[Rule, ...] = (
    *quantize_lower_ops.RULES,  # observers first: they turn fake_quantization's inputs into constants
    *quantize_lower_patterns.RULES,
    *quantize_lower_qdq.RULES,
)
_KNOWN_DOMAINS = (*AI_ONNX_DOMAINS, "com.microsoft")
_FAKE_QUANT_WORDS = ("quant", "observer")


@dataclass(frozen=True)
class Lowered:
    """The lowered model, the activations to verify on data, how many sites were lowered, and the findings."""

    model: onnx.ModelProto
    checks: list[ActivationCheck]
    sites: int
    findings: LoweringNotes


def lower_model(model: onnx.ModelProto, variant: str, rules: tuple[Rule, ...] = DEFAULT_RULES) -> Lowered:
    """Apply the rules; returns the lowered model, the activations to verify on data, and the findings."""
    import onnx_ir as ir
    from onnx_ir.passes.common import RemoveUnusedNodesPass, RemoveUnusedOpsetsPass

    model = _at_least_opset(model, variant)
    ir_model = ir.from_proto(_with_shapes(model))
    sites: list[SiteRecord] = []
    refused: list[RefusedSite] = []
    checks: list[ActivationCheck] = []
    for graph in _graphs(ir_model.graph):
        editor = LoweringEditor(graph)
        for rule in rules:
            _apply(rule, editor, sites, refused)
        if graph is ir_model.graph:
            checks = editor.checks
    left = unknown_fake_quant_ops(ir_model.graph)
    if left:
        why = {name: item["reason"] for item in refused for name in item["nodes"]}
        listed = "; ".join(f"{item['node']} ({item['domain'] or 'ai.onnx'}::{item['op_type']}): "
                           f"{why.get(item['node'], 'no rule knows this op')}" for item in left)
        raise StageError(STAGE, variant, f"fake-quant ops that mode lower cannot lower: {listed} (known forms: "
                                         f"{', '.join(rule.name for rule in rules)})")
    RemoveUnusedNodesPass()(ir_model)
    RemoveUnusedOpsetsPass()(ir_model)
    return Lowered(ir.to_proto(ir_model), checks, len(sites), _findings(sites, refused))


def _at_least_opset(model: onnx.ModelProto, variant: str) -> onnx.ModelProto:
    import onnx

    opset = next((entry.version for entry in model.opset_import if entry.domain in AI_ONNX_DOMAINS), 1)
    if opset >= MIN_OPSET:
        return model
    try:
        return onnx.version_converter.convert_version(model, MIN_OPSET)
    except Exception as exc:
        raise StageError(STAGE, variant, f"mode lower writes QuantizeLinear/DequantizeLinear of opset {MIN_OPSET}; "
                                         f"the model has opset {opset} and converting it failed ({exc}): set "
                                         f"model.opset: {MIN_OPSET} or higher in the recipe") from exc


def _with_shapes(model: onnx.ModelProto) -> onnx.ModelProto:
    """Shapes and types where onnx can infer them (ranks decide per-axis parameters); the model as is otherwise."""
    import onnx

    try:
        return onnx.shape_inference.infer_shapes(model, strict_mode=False)
    except Exception as exc:  # custom-domain ops defeat inference on some graphs; rules cope with missing shapes
        log.debug("shape inference before lowering failed: %s", exc)
        return model


def _graphs(graph: ir.Graph) -> Iterator[ir.Graph]:
    """The graph and every subgraph (If/Loop/Scan bodies), outermost first."""
    import onnx_ir as ir

    yield graph
    for node in graph:
        for attr in node.attributes.values():
            if attr.type == ir.AttributeType.GRAPH:
                yield from _graphs(attr.value)
            elif attr.type == ir.AttributeType.GRAPHS:
                for subgraph in attr.value:
                    yield from _graphs(subgraph)


def _apply(rule: Rule, editor: LoweringEditor, sites: list[SiteRecord], refused: list[RefusedSite]) -> None:
    for node in list(editor.graph):
        if node.graph is not editor.graph:  # removed by an earlier match of this rule
            continue
        match = rule.pattern(node)
        if match is None:
            continue
        reason = rule.check(match)
        if reason is None:
            try:
                sites.append(rule.replacement(match, editor))
                continue
            except Refused as exc:
                reason = str(exc)
        refused.append({"rule": rule.name, "nodes": match.names, "reason": reason})
        log.info("lowering rule %s refused %s: %s", rule.name, match.names, reason)


def unknown_fake_quant_ops(graph: ir.Graph) -> list[dict[str, str]]:
    """Nodes that look like fake quantization (custom-domain *quant*/*observer* ops, ATen fake_quantize_*)."""
    unknown = []
    for sub in _graphs(graph):
        for node in sub:
            name = node.op_type.lower()
            aten = node.op_type == "ATen" and "quant" in str(getattr(node.attributes.get("operator"), "value", ""))
            custom = node.domain not in _KNOWN_DOMAINS and any(word in name for word in _FAKE_QUANT_WORDS)
            if aten or custom:
                unknown.append({"node": node.name or node.op_type, "op_type": node.op_type, "domain": node.domain})
    return unknown


def _findings(sites: list[SiteRecord], refused: list[RefusedSite]) -> LoweringNotes:
    counts: dict[str, int] = {}
    for site in sites:
        counts[site["rule"]] = counts.get(site["rule"], 0) + 1
    inexact = [site for site in sites if site.get("max_difference", 0.0) > 0.0]
    worst = max(inexact, key=lambda site: site["max_difference"], default=None)
    return LoweringNotes(
        lowered=counts,
        sites=sites[:MAX_SITES_LISTED],
        sites_not_listed=max(0, len(sites) - MAX_SITES_LISTED),
        refused=refused,
        inexact={
            "count": len(inexact),
            "largest_difference": worst["max_difference"] if worst else 0.0,
            "tensor": worst.get("tensor") if worst else None,
            "step": worst.get("step") if worst else None,
        },
    )


def verify_on_data(model: onnx.ModelProto, checks: list[ActivationCheck], feeds: Iterable[dict[str, np.ndarray]],
                   work_dir: Path, variant: str) -> LoweringVerification:
    """Run the lowered model in ONNX Runtime; each lowered activation must match its reference within one step."""
    if not checks:
        return LoweringVerification(samples=0, checked=0, note="no lowered activations to check")
    session, names = _probe(model, checks, work_dir, variant)
    worst: dict[int, float] = {}
    samples = 0
    for feed in feeds:
        values = dict(zip(names, session.run(names, feed), strict=True)) | feed
        for index, check in enumerate(checks):
            error = float(np.max(np.abs(check.reference(values[check.x]) - values[check.y]), initial=0.0))
            worst[index] = max(worst.get(index, 0.0), error)
        samples += 1
    failures = [ActivationMiss(tensor=check.y, rule=check.rule, max_error=worst[index], step=check.step,
                               reported_difference=check.max_difference)
                for index, check in enumerate(checks) if worst.get(index, 0.0) > _allowed(check)]
    steps = max((worst[index] / check.step for index, check in enumerate(checks) if index in worst), default=0.0)
    result = LoweringVerification(samples=samples, checked=len(checks), max_error_steps=steps, failures=failures)
    if failures:
        raise StageError(STAGE, variant, f"lowered fake-quant differs from its reference by more than one step: "
                                         f"{failures[:5]}")
    return result


def _allowed(check: ActivationCheck) -> float:
    return (check.max_difference + check.step) * (1 + 1e-5) + 1e-7


def _probe(model: onnx.ModelProto, checks: list[ActivationCheck], work_dir: Path,
           variant: str) -> tuple[Any, list[str]]:
    import onnx
    import onnxruntime as ort

    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    inputs = {value.name for value in probe.graph.input}
    present = {value.name for value in probe.graph.output}
    names = list(dict.fromkeys(name for check in checks for name in (check.x, check.y) if name not in inputs))
    for name in names:
        if name not in present:
            probe.graph.output.append(onnx.ValueInfoProto(name=name))
    path = work_dir / "lowered_probe.onnx"
    save_onnx(probe, path)  # with external data above protobuf's 2 GB limit
    options = ort.SessionOptions()
    options.log_severity_level = 3
    try:
        session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    except Exception as exc:
        raise StageError(STAGE, variant, f"the lowered model does not load in ONNX Runtime: {exc}") from exc
    return session, names
