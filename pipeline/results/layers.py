"""The per-layer pass (``report.layers``): where the time and the error come from, layer by layer, on each target.

It runs after the timed benchmark and apart from it (its profiled sessions never feed a latency number), on the
pairs the recipe's setting names: ``auto`` profiles what the verdict ships on each target and every pair whose
validation failed; ``full`` profiles every evaluated pair and keeps every row; ``off`` skips the pass.
Per pair it joins:
- time and the precision that ran, per executed layer (``qdeploy.targets.layer_profile``: ORT's session
  profile, OpenVINO's performance counters mapped to ONNX nodes through the runtime model);
- each node's error against the float32 reference's same tensor (``qdeploy.stages.validate._layers_error``);
- MACs from the reference's tensor shapes (``qdeploy.stages.benchmark._layers_macs``);
- what the build decided: nodes the quantizer's budget kept float, nodes the recipe excluded, nodes blocked from
  fp16 with the overflow evidence (the artifact's lineage findings).
The pass's own wall time is the section's ``seconds`` and is added to the run's.
"""

from __future__ import annotations

import logging
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from qdeploy.core.compare import SNR_CAP_DB
from qdeploy.core.context import Artifact
from qdeploy.core.onnx_wire import load_model
from qdeploy.core.report import Report, as_report
from qdeploy.core.rows import BenchmarkRow
from qdeploy.pipeline.recipe.schema import Recipe
from qdeploy.pipeline.results.layers_summary import (
    TOP,
    LayerGraphFacts,
    PairSummaryDict,
    ProfiledLayerRow,
    TimelineColumns,
    float_reason,
    pair_summary,
    timeline,
    top_rows,
)
from qdeploy.stages.benchmark import node_macs
from qdeploy.stages.export import model_size_on_disk
from qdeploy.stages.validate import NodeErrorRecord, OutputExposure, feed_caster, layer_errors, reference_source
from qdeploy.targets.base import short_message
from qdeploy.targets.layer_profile import LayerTime, profile_layers

if TYPE_CHECKING:
    import numpy as np

__all__ = ["AUTO_MAX_BYTES", "FEEDS", "LayerPairDict", "LayersSectionDict", "PairProfileDict", "add_layers",
           "added_error", "decisions_of", "layers_section", "profile_pair", "profiled_pairs"]

log = logging.getLogger(__name__)

FEEDS = 4
AUTO_MAX_BYTES = 512_000_000
"""Largest artifact ``auto`` profiles: above it the exposed tensors would break the whole run's memory bound
(docs/large-models.md); ``full`` profiles every size."""
"""Validation samples the error pass compares on (the first ones)."""
_QDQ = ("QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear")


class PairProfileDict(TypedDict):
    """The profiled session: its runs, the median profiled inference, the benchmark's p50 for the pair."""

    runs: int
    profiled_ms: float
    benchmark_p50_ms: float | None


class _PairKeys(TypedDict):
    variant: str
    target: str
    why: str
    precision: str


class LayerPairDict(_PairKeys, total=False):
    """One profiled (variant, target) as report.json's ``layers.pairs`` holds it (``LayerPair`` reads it): with
    ``status`` ok its summary, rows and what the build decided; ``skipped`` or ``error`` with the ``reason``."""

    status: str
    reason: str
    seconds: float
    samples: int
    exposure: OutputExposure
    notes: list[str]
    profile: PairProfileDict
    summary: PairSummaryDict
    top_time: list[ProfiledLayerRow]
    top_error: list[ProfiledLayerRow]
    rows_total: int
    timeline: TimelineColumns
    unclaimed_nodes: list[str]
    decisions: dict[str, str]
    pinned_precision: str | None
    rows: list[ProfiledLayerRow]


class _SectionKeys(TypedDict):
    mode: str
    top: int
    pairs: list[LayerPairDict]


class LayersSectionDict(_SectionKeys, total=False):
    """report.json's ``layers`` section as the pass writes it (``qdeploy.core.layer_rows.LayersSection`` reads it):
    ``seconds`` the pass's time, ``reason`` why no pair was profiled."""

    seconds: float
    reason: str


def profiled_pairs(mode: str, report: Report | Mapping[str, Any], evaluated: list[str],
                   targets: list[str]) -> list[tuple[str, str, str]]:
    """(variant, target, why) to profile: ``auto``: what the verdict ships and what failed validation; ``full``:
    every evaluated pair that validation could run."""
    report = as_report(report)
    rows = [row for row in report.validation if row.variant in evaluated and row.target in targets
            and row.target != "reference:cpu"]
    if mode == "full":
        return [(row.variant, row.target, "full") for row in rows if row.status in ("passed", "failed")]
    shipped = report.verdict.targets if report.verdict else {}
    pairs = [(choice.variant, target, "shipped") for target, choice in shipped.items()
             if choice.variant in evaluated and target in targets and choice.status == "ship"]
    pairs += [(row.variant, row.target, "failed validation") for row in rows if row.status == "failed"]
    return list({(v, t): (v, t, why) for v, t, why in pairs if v is not None}.values())


def add_layers(report: Report, recipe: Recipe, artifacts: dict[str, Artifact], targets: list[str]) -> Report:
    """The report with its ``layers`` section (absent with ``report.layers: off``), the pass's time added to the
    run's."""
    section = layers_section(recipe, artifacts, report, targets)
    if section is None:
        return report
    return report.replace(layers=section, seconds=report.seconds + section["seconds"])


def layers_section(recipe: Recipe, artifacts: dict[str, Artifact], report: Report,
                   targets: list[str]) -> LayersSectionDict | None:
    """The report's ``layers`` section as report.json holds it; None when the recipe turns it off."""
    mode = recipe.report.layers
    if mode == "off":
        return None
    started = time.perf_counter()
    pairs = profiled_pairs(mode, report, list(artifacts), targets)
    section: LayersSectionDict = {"mode": mode, "top": TOP, "pairs": []}
    if pairs:
        with tempfile.TemporaryDirectory(prefix="qdeploy-layers-") as work:
            section["pairs"] = _profile_pairs(recipe, artifacts, report, pairs, Path(work), section)
    section["seconds"] = time.perf_counter() - started
    return section


def _profile_pairs(recipe: Recipe, artifacts: dict[str, Artifact], report: Report, pairs: list[tuple[str, str, str]],
                   work: Path, section: LayersSectionDict) -> list[LayerPairDict]:
    ctx = recipe.stage_context("*", work)
    try:
        source = reference_source(artifacts, recipe.validate_, ctx)
    except Exception as exc:  # no reference was built: nothing to compare with (validation says why)
        section["reason"] = f"no reference to compare with: {exc}"
        return []
    feeds = list(ctx.samples(recipe.validate_.data, source.feed_model, limit=min(FEEDS, recipe.validate_.samples)))
    full = section["mode"] == "full"
    return [(None if full else _too_large(artifacts[variant], variant, target, why))
            or profile_pair(artifacts[variant], variant, target, why, source.path, feeds, report, full=full)
            for variant, target, why in pairs]


def _too_large(artifact: Artifact, variant: str, target: str, why: str) -> LayerPairDict | None:
    """A skipped record for an artifact above ``AUTO_MAX_BYTES`` (``auto`` only): the pass runs the reference and
    the artifact with every intermediate tensor exposed, which would break the run's memory bound."""
    size = model_size_on_disk(Path(artifact.path)) or 0
    if size <= AUTO_MAX_BYTES:
        return None
    return {"variant": variant, "target": target, "why": why, "precision": artifact.precision,
            "status": "skipped", "seconds": 0.0,
            "reason": f"{size / 1e9:.2f} GB model, above the {AUTO_MAX_BYTES / 1e9:.1f} GB that report.layers "
                      "auto profiles (every intermediate tensor is held); report.layers: full profiles it"}


def profile_pair(artifact: Artifact, variant: str, target: str, why: str, reference: Path,
                 feeds: list[dict[str, np.ndarray]], report: Report | Mapping[str, Any], *,
                 full: bool) -> LayerPairDict:
    """One pair's record: its summary, top rows, timeline, and every row with ``full``; errors are recorded."""
    report = as_report(report)
    started = time.perf_counter()
    record: LayerPairDict = {"variant": variant, "target": target, "why": why, "precision": artifact.precision}
    shipped = _shipped_pin(report, variant, target)
    pin_f32 = artifact.precision == "fp32"
    try:
        cast = feed_caster(artifact.path)  # an fp16 model may take float16 inputs
        profile = profile_layers(artifact.path, target, cast(feeds[0]), pin_f32=pin_f32, precision=shipped,
                                 also_run=[cast(feed) for feed in feeds])
        errors = layer_errors(reference, artifact.path, target, feeds, pin_f32=pin_f32,
                              shipped=profile.outputs if not shipped else None)  # a pin: validation's own run
    except Exception as exc:  # a diagnosis: its failure must not cost the run its report
        log.warning("layers of %s on %s: %s", variant, target, exc, exc_info=log.isEnabledFor(logging.DEBUG))
        return {**record, "status": "error", "reason": f"{type(exc).__name__}: {short_message(exc)}",
                "seconds": time.perf_counter() - started}
    graph = _graph_facts(artifact.path)
    macs = node_macs(load_model(reference, load_external_data=False), errors.shapes)
    decisions = decisions_of(report, variant)
    rows = [_row(layer, macs, errors.per_node, decisions, graph, target, artifact.precision)
            for layer in profile.layers]
    added_error(rows, errors.per_node, graph)
    claimed = {node for row in rows for node in row["nodes"]}
    speedup = _speedup(report, variant, target)
    record.update({
        "status": "ok", "samples": errors.samples, "exposure": errors.exposure, "notes": profile.notes,
        "profile": {"runs": profile.runs, "profiled_ms": profile.profiled_ms,
                    "benchmark_p50_ms": _p50(report, variant, target)},
        "summary": pair_summary(rows, target=target, artifact_precision=artifact.precision, speedup=speedup),
        "top_time": top_rows(rows, "time_ms"), "top_error": top_rows(rows, "snr_db"), "rows_total": len(rows),
        "timeline": timeline(rows),
        "unclaimed_nodes": [n for n in graph["order"] if n not in claimed and graph["op_types"][n] not in _QDQ
                            and graph["op_types"][n] != "Constant"],
        "decisions": decisions, "pinned_precision": shipped,
    })
    if full:
        record["rows"] = rows
    record["seconds"] = time.perf_counter() - started
    return record


def _row(layer: LayerTime, macs: dict[str, int], errors: dict[str, NodeErrorRecord], decisions: dict[str, str],
         graph: LayerGraphFacts, target: str, precision: str) -> ProfiledLayerRow:
    nodes = layer.nodes
    row = {**layer.to_dict(), "macs": sum(macs.get(n, 0) for n in nodes) or None, "error_node": None, "snr_db": None,
           "cosine": None, "nonfinite": 0, "decision": next((decisions[n] for n in nodes if n in decisions), None)}
    measured = [n for n in nodes if n in errors]
    if measured:  # a fused group: its output is that of its last measured node
        last = max(measured, key=graph["position"].__getitem__)
        row.update(error_node=last, snr_db=errors[last]["snr_db"], cosine=errors[last]["cosine"],
                   nonfinite=errors[last]["nonfinite"])
    row["qdq_nodes"] = [n for n in nodes if graph["op_types"].get(n) in _QDQ]
    compute = next((n for n in nodes if n in macs), None)
    row["compute_op"] = graph["op_types"].get(compute) if compute else None
    reduced = precision in ("int8", "int4") and row["precision"] != "int8"
    row["float_reason"] = None
    if row["macs"] and (reduced or (precision == "fp16" and row["precision"] == "f32")):
        row["float_reason"] = float_reason(nodes, decisions, graph, target) if reduced else \
            next((decisions[n] for n in nodes if n in decisions), f"{target} has no float16 kernel for it")
    return row


def added_error(rows: list[ProfiledLayerRow], errors: dict[str, NodeErrorRecord], graph: LayerGraphFacts) -> None:
    """Per row, the error it adds: the SNR its inputs arrive with (the worst measured producer outside its group;
    exact inputs, weights and graph inputs count as SNR_CAP_DB) minus its own, and whether NaN/Inf is born here."""
    for row in rows:
        upstream = [errors[name] for name in _measured_inputs(row["nodes"], errors, graph)]
        arriving = min((e["snr_db"] for e in upstream if e["snr_db"] is not None), default=SNR_CAP_DB)
        row["snr_drop_db"] = None if row["snr_db"] is None else max(0.0, arriving - row["snr_db"])
        row["nonfinite_born"] = bool(row["nonfinite"]) and not any(e["nonfinite"] for e in upstream)


def _measured_inputs(nodes: list[str], errors: dict[str, NodeErrorRecord], graph: LayerGraphFacts) -> set[str]:
    """The measured nodes a group's inputs come from: upstream of its first node (a node the runtime fused without
    naming it sits inside the group, not before it), through unmeasured conversions (Q/DQ, Cast) at most 4 deep."""
    if not nodes:
        return set()
    first = min(graph["position"].get(n, 0) for n in nodes)
    found: set[str] = set()
    frontier = [p for n in nodes for p in graph["producers"].get(n, []) if graph["position"].get(p, 0) < first]
    for _ in range(4):
        found |= {p for p in frontier if p in errors}
        frontier = [q for p in frontier if p not in errors for q in graph["producers"].get(p, [])]
    return found


def _graph_facts(path: Path) -> LayerGraphFacts:
    """Op types, order, and per compute node: fed by a DequantizeLinear, followed by a QuantizeLinear."""
    model = load_model(path, load_external_data=False)
    made_by = {out: node for node in model.graph.node for out in node.output}
    read_by: dict[str, list[Any]] = {}
    for node in model.graph.node:
        for name in node.input:
            read_by.setdefault(name, []).append(node)
    names = [node.name or f"{node.op_type}_{index}" for index, node in enumerate(model.graph.node)]
    facts: LayerGraphFacts = {"op_types": {}, "order": names, "position": {}, "dq_fed": {}, "q_after": {},
                             "producers": {}}
    name_of = {id(node): name for name, node in zip(names, model.graph.node, strict=True)}
    for index, (name, node) in enumerate(zip(names, model.graph.node, strict=True)):
        facts["op_types"][name] = node.op_type
        facts["position"][name] = index
        facts["dq_fed"][name] = any(made_by.get(i) is not None and made_by[i].op_type == "DequantizeLinear"
                                    for i in node.input[:2])
        facts["producers"][name] = [name_of[id(made_by[i])] for i in node.input if i in made_by]
        facts["q_after"][name] = any(c.op_type == "QuantizeLinear" for out in node.output for c in read_by.get(out, []))
    return facts


class _Read(BaseModel):
    """What the pass reads of a step's findings, typed; the findings' other keys are the stage's own."""

    model_config = ConfigDict(extra="ignore")


class _KeptFloat(_Read):
    node: str
    rank: int | None = None
    reason: str | None = None


class _Budget(_Read):
    kept_float: list[_KeptFloat] = Field(default_factory=list)


class _QuantizeDecisions(_Read):
    """Of a quantize step (``qdeploy.stages.quantize.findings``): the nodes the recipe excluded and those the
    accuracy budget kept float."""

    excluded: list[str] = Field(default_factory=list)
    budget: _Budget | None = None


class _KeptFp32(_Read):
    node: str
    tensor: str | None = None
    predicted: float | None = None
    reason: str | None = None
    observed: Any = None


class _Fp16Decisions(_Read):
    """Of an fp16 step (``qdeploy.stages.fp16.findings``): the recipe's blocked nodes and those kept float32."""

    node_block_list: list[str] = Field(default_factory=list)
    kept_in_fp32: list[_KeptFp32] = Field(default_factory=list)


def decisions_of(report: Report | Mapping[str, Any], variant: str) -> dict[str, str]:
    """Node -> what the build decided for it: kept float by the budget (rank, reason), excluded by the recipe,
    kept in float32 by fp16 (the overflow evidence) or blocked there by the recipe (read from the lineage's
    findings; a step whose findings say otherwise than these models is passed over)."""
    artifact = as_report(report).artifact(variant)
    decided: dict[str, str] = {}
    for step in artifact.lineage if artifact else []:
        try:
            if step.stage == "quantize":
                quantized = _QuantizeDecisions.model_validate(step.findings or {})
                for name in quantized.excluded:
                    decided[name] = "kept float: excluded by the recipe (quantize.exclude_nodes)"
                for kept in quantized.budget.kept_float if quantized.budget else []:
                    decided[kept.node] = f"kept float by the accuracy budget (rank {kept.rank}: {kept.reason})"
            elif step.stage == "fp16":
                blocked = _Fp16Decisions.model_validate(step.findings or {})
                for name in blocked.node_block_list:
                    decided[name] = "blocked from fp16 by the recipe (fp16.node_block_list)"
                for held in blocked.kept_in_fp32:
                    decided[held.node] = "blocked from fp16: " + _overflow_words(held)
        except ValidationError as exc:  # a diagnosis: an unexpected record costs its decisions, not the report
            log.warning("layers: the %s findings of %s are not as this qdeploy reads them: %s", step.stage,
                        variant, exc.errors()[0]["msg"])
    return decided


def _overflow_words(kept: _KeptFp32) -> str:
    if kept.predicted is not None:
        return (f"{kept.reason or 'activation range'}: tensor '{kept.tensor or '?'}' predicted "
                f"{kept.predicted:.3g}, beyond float16's 65504")
    evidence = [(key, getattr(kept, key)) for key in ("tensor", "reason", "observed") if key in kept.model_fields_set]
    return ", ".join(f"{key} {value}" for key, value in evidence) or "overflows float16"


def _shipped_pin(report: Report, variant: str, target: str) -> str | None:
    return next((row.deploy_precision for row in report.validation
                 if row.variant == variant and row.target == target and row.deploy_precision), None)


def _bench(report: Report, variant: str, target: str) -> BenchmarkRow | None:
    rows = [row for row in report.benchmarks if row.variant == variant and row.target == target
            and row.status == "ok"]
    return min(rows, key=lambda row: row.batch_size) if rows else None


def _speedup(report: Report, variant: str, target: str) -> float | None:
    row = _bench(report, variant, target)
    return row.speedup if row else None


def _p50(report: Report, variant: str, target: str) -> float | None:
    row = _bench(report, variant, target)
    return row.p50 if row else None
