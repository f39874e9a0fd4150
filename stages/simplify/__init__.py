"""The ``simplify`` stage: shape inference, constant folding, rewrites and onnxoptimizer passes, to a fixed point.

The algorithm is onnx-simplifier's: infer shapes and fold what is constant
(``qdeploy.stages.simplify._folding``) until folding finds nothing more, apply the recipe's
rewrites (``qdeploy.graph.rewrites``; by default per-channel scales, shifts and
BatchNormalization fused into convolutions), run onnxoptimizer's fuse and
eliminate passes (``qdeploy.stages.simplify._optimizer``), and repeat until the graph stops
changing.  Then the simplified model is compared with the original on seeded
random inputs in ONNX Runtime (``qdeploy.stages.simplify._check``); a disagreement fails
the stage, so the runner keeps the unsimplified model.

Subgraphs (If/Loop/Scan bodies) are folded too (``fold_subgraphs``), with
onnxoptimizer's passes entering them; the equivalence check covers them.

Speed: each round serialises nothing it does not have to.  Folding evaluates
all foldable nodes of a graph in one ONNX Runtime session; shape inference
and onnxoptimizer get the model with its large weights replaced by tags
(``qdeploy.stages.simplify._optimizer``), and a large graph goes through onnxoptimizer in
pieces (``qdeploy.stages.simplify._optimizer_pieces``: its time grows with the square of the
node count); a round whose folding and rewrites changed nothing since
onnxoptimizer's last fixed point ends the loop without calling it again.

A simplified model above protobuf's 2 GB limit is saved with one external data
file and checked from that file (the runner stores that file as it is); folding
works in pieces small enough for ONNX Runtime.
"""

from __future__ import annotations

import gc
import logging
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from qdeploy.core.context import Artifact, StageContext, StageResult
from qdeploy.core.errors import StageError
from qdeploy.core.values import one_line
from qdeploy.graph.edit import GraphNotEditable
from qdeploy.graph.external_data import load_graph_only, save_exposing, save_onnx
from qdeploy.graph.names import name_nodes_uniquely
from qdeploy.graph.order import (
    scope_problems,
    sort_topologically,
    subgraph_initializers_to_constants,
    unread_subgraph_constants,
)
from qdeploy.graph.rewrites import RewriteReport, apply_rewrites
from qdeploy.graph.utils import (
    fingerprint,
    has_subgraph,
    io_names,
    model_bytes,
    op_counts,
    prune_unproduced_value_info,
)
from qdeploy.stages.simplify import _optimizer, _optimizer_pieces  # attributes read at call time: tests set them
from qdeploy.stages.simplify._check import check_equivalence
from qdeploy.stages.simplify._folding import constants_to_initializers, fold_constants, sync_legacy_inputs
from qdeploy.stages.simplify._interface import interface_types, restore_interface_types
from qdeploy.stages.simplify._optimizer import likely_passes
from qdeploy.stages.simplify._rewrite_if import PASS_NAME, inline_constant_ifs
from qdeploy.stages.simplify._shapes import infer_shapes
from qdeploy.stages.simplify.config import CHECK_FROM_FILE_BYTES, MAX_FOLD_ROUNDS, STAGE, SimplifyConfig
from qdeploy.stages.simplify.findings import EquivalenceCheck, SimplifyFindings, Unchecked

if TYPE_CHECKING:
    import onnx

    from qdeploy.stages.simplify._folding import FoldReport, SkippedTensor

__all__ = ["SimplifyConfig", "run"]

log = logging.getLogger(__name__)

@dataclass
class _SimplifyStatistics:
    """What the simplification loop did, gathered over its iterations."""

    iterations: int = 0
    folded_tensors: int = 0
    folded_nodes: int = 0
    constants_converted: int = 0
    folded: dict[str, int] = field(default_factory=dict)
    skipped: dict[str, SkippedTensor] = field(default_factory=dict)
    failed_ops: set[str] = field(default_factory=set)
    notes: list[str] = field(default_factory=list)
    rewrites: RewriteReport = field(default_factory=lambda: _rewrite_report())
    rewrites_seen: int = 0
    """Rewrite matches already counted by ``rewrites_applied``."""
    optimizer_calls: int = 0
    optimizer_delta: Counter[str] = field(default_factory=Counter)
    """Net change of node count per op type over all onnxoptimizer calls (negative: removed)."""
    seconds: Counter[str] = field(default_factory=Counter)

    def add_fold(self, report: FoldReport) -> None:
        self.folded_tensors += report.folded_tensors
        self.folded_nodes += report.folded_nodes
        self.constants_converted += report.constants_converted
        self.folded.update(report.folded)
        self.skipped.update((entry["tensor"], entry) for entry in report.skipped)
        self.failed_ops.update(report.failed_ops)

    def note(self, text: str) -> None:
        if text not in self.notes:
            self.notes.append(text)

    def rewrites_applied(self) -> int:
        """Matches rewritten since the last call."""
        total = sum(self.rewrites.applied.values())
        new, self.rewrites_seen = total - self.rewrites_seen, total
        return new


def _rewrite_report() -> RewriteReport:
    return RewriteReport()


def run(artifact: Artifact, config: SimplifyConfig, ctx: StageContext) -> StageResult:
    """Simplify ``artifact``'s model; check it against the original; report what changed."""
    model = artifact.load()
    reference = _reference_from_file(model, artifact.path, config, ctx.work_dir)
    name_nodes_uniquely(model)  # a model that did not come through export; naming alone is no change
    before = fingerprint(model)
    nodes_before = op_counts(model)
    interface = io_names(model)
    types = interface_types(model)
    subgraph_initializers_to_constants(model.graph)  # the form exporters write and every tool handles
    stats = _SimplifyStatistics()
    subgraph_ops = sorted({node.op_type for node in model.graph.node if has_subgraph(node)})
    if subgraph_ops:
        stats.note(f"subgraphs (in {', '.join(subgraph_ops)} nodes): onnxoptimizer's passes enter them; "
                      + ("constants folded inside them" if config.fold_subgraphs and config.fold_constants
                         else "no folding inside them"))
    model = _simplify(model, config, ctx.work_dir, stats)
    stats.constants_converted += constants_to_initializers(model.graph)
    sync_legacy_inputs(model, drop_unused="eliminate_unused_initializer" in config.passes())
    prune_unproduced_value_info(model)
    name_nodes_uniquely(model)  # nodes the optimizer added without a name
    if io_names(model) != interface:
        raise StageError(STAGE, ctx.variant, f"simplification changed the model's inputs/outputs from "
                         f"{interface} to {io_names(model)}")
    _valid_structure(model, types, stats, ctx)
    started = time.perf_counter()
    saved = None
    if model_bytes(model) > CHECK_FROM_FILE_BYTES:  # ONNX Runtime takes it from a file: no serialised copy
        saved = ctx.work_dir / "simplified.onnx"
        save_onnx(model, saved, location="simplified.onnx.data", threshold=0)
        # protobuf frees a message's bytes only with the whole message: drop it, keep the graph alone
        model = load_graph_only(saved)
        gc.collect()  # the old message may sit in a reference cycle: free its weights now, before the check
    if config.check_n == 0:
        check: EquivalenceCheck | Unchecked = Unchecked(unchecked="check_n is 0")
    else:
        check = check_equivalence(reference, model, config, ctx, saved=saved)
    if reference != artifact.path:
        for leftover in (reference, reference.with_name(reference.name + ".data")):
            leftover.unlink(missing_ok=True)
    stats.seconds["check"] += time.perf_counter() - started
    findings = _findings(nodes_before, model, config, stats, check)
    log.info("simplify: %d -> %d nodes in %d iteration(s); %d tensor(s) folded", findings.node_count_before,
             findings.node_count_after, stats.iterations, stats.folded_tensors)
    return StageResult(model=model, changed=fingerprint(model) != before, findings=findings, path=saved)


def _reference_from_file(model: onnx.ModelProto, path: Path, config: SimplifyConfig, work_dir: Path) -> Path:
    """The original model as the check's reference loads it: a large one-file model rewritten with its weights in
    a data file beside it (ONNX Runtime maps that file, where parsing a one-file model holds its bytes twice)."""
    if config.check_n == 0 or path.stat().st_size <= CHECK_FROM_FILE_BYTES:
        return path
    reference = work_dir / "original.onnx"
    work_dir.mkdir(parents=True, exist_ok=True)
    save_exposing(model, reference, [], external=True)  # tensor by tensor: no copy of the model
    return reference


def _valid_structure(model: onnx.ModelProto, types: dict[str, onnx.TypeProto], stats: _SimplifyStatistics,
                     ctx: StageContext) -> None:
    """Every graph in topological order and in scope, the interface types as they were; StageError otherwise."""
    unread_subgraph_constants(model.graph)
    repair = restore_interface_types(model, types)
    for entry in repair.restored:
        stats.note(f"type of '{entry}' put back (a pass had dropped it)")
    if repair.conflicts:
        raise StageError(STAGE, ctx.variant, f"simplification changed the types of {repair.conflicts}")
    if scope_problems(model.graph) and sort_topologically(model.graph):
        stats.note("nodes put back in topological order")
    problems = scope_problems(model.graph)
    if problems:
        raise StageError(STAGE, ctx.variant, f"the simplified model is not a valid graph: {'; '.join(problems)}")


def _simplify(model: onnx.ModelProto, config: SimplifyConfig, work_dir: Path,
              stats: _SimplifyStatistics) -> onnx.ModelProto:
    """Folding rounds, rewrites and passes, repeated until the graph stops changing."""
    passes = config.passes()
    rewrites = config.active_rewrites()
    stats.constants_converted += constants_to_initializers(model.graph)  # weights in Constant nodes, as Paddle
    optimized = False  # the model is onnxoptimizer's fixed point
    for iteration in range(1, config.max_iterations + 1):
        stats.iterations = iteration
        done = stats.folded_nodes + stats.constants_converted
        model = _fold_rounds(model, config, work_dir, stats)
        if rewrites:
            model = _timed(stats, "rewrites", _rewrite, model, rewrites, stats)
        rewritten = stats.rewrites_applied()  # called every round: it counts from its last call
        changed = stats.folded_nodes + stats.constants_converted != done or rewritten > 0
        optimized = optimized and not changed
        if optimized or not (passes or changed):
            return model  # nothing changed since onnxoptimizer's last fixed point (or, without passes, at all)
        if not passes:
            continue
        start = fingerprint(model)
        model = _timed(stats, "onnxoptimizer", _optimize, model, passes, stats)
        optimized = True
        if fingerprint(model) == start and not changed:
            return model
    stats.note(f"stopped after max_iterations={config.max_iterations} before reaching a fixed point")
    return model


def _timed(stats: _SimplifyStatistics, phase: str, function: Any, *args: Any, **kwargs: Any) -> Any:
    started = time.perf_counter()
    try:
        return function(*args, **kwargs)
    finally:
        stats.seconds[phase] += time.perf_counter() - started


def _fold_rounds(model: onnx.ModelProto, config: SimplifyConfig, work_dir: Path,
                 stats: _SimplifyStatistics) -> onnx.ModelProto:
    """Shape inference and folding until folding finds nothing more (each fold can make more shapes static)."""
    for _ in range(MAX_FOLD_ROUNDS):
        model = _timed(stats, "shape_inference", infer_shapes, model, work_dir, stats)
        if not config.fold_constants:
            stats.constants_converted += constants_to_initializers(model.graph)
            return model
        report = _timed(stats, "folding", fold_constants, model, limit_bytes=config.fold_limit_bytes,
                        subgraphs=config.fold_subgraphs)
        stats.add_fold(report)
        sync_legacy_inputs(model, drop_unused=False)
        if report.folded_nodes == 0:
            break
    return model


def _rewrite(model: onnx.ModelProto, names: list[str], stats: _SimplifyStatistics) -> onnx.ModelProto:
    try:
        apply_rewrites(model, names, stats.rewrites)
    except GraphNotEditable as exc:  # the rewrites are an optimisation: the model stays as it is
        stats.note(f"rewrites skipped: {exc}")
    return model


def _optimize(model: onnx.ModelProto, passes: list[str], stats: _SimplifyStatistics) -> onnx.ModelProto:
    """onnxoptimizer's passes to a fixed point; the input model when they fail or touch the interface."""
    stats.optimizer_calls += 1
    if len(model.graph.node) > _optimizer.PIECES_ABOVE:
        stats.note(f"onnxoptimizer ran on pieces of {_optimizer_pieces.PIECE_NODES} nodes (its time grows with the "
                   "square of the node count); a pattern across two pieces may be left")
    subgraph_initializers_to_constants(model.graph)
    types = interface_types(model)
    if PASS_NAME in passes:  # ours: onnxoptimizer's loses nodes of nested subgraphs
        try:
            inlined = inline_constant_ifs(model)
        except GraphNotEditable as exc:
            inlined = 0
            stats.note(f"constant If nodes not inlined: {exc}")
        if inlined:
            stats.note(f"{inlined} If node(s) with a constant condition replaced by their branch")
            stats.optimizer_delta.update({"If": -inlined})
    try:
        result = _optimizer.optimize(model, [name for name in passes if name != PASS_NAME])
    except Exception as exc:  # a crash of the optimizer must not lose the folding done so far
        stats.note(f"onnxoptimizer failed, its passes were not applied: {one_line(exc)}")
        return model
    optimized = result.model  # light (weights as tags) until accepted: the checks read structure only
    if io_names(optimized) != io_names(model):
        stats.note("onnxoptimizer changed the model's inputs/outputs; its result was discarded")
        return model
    problem = _optimizer_damage(optimized, types, stats)
    if problem:
        stats.note(f"onnxoptimizer's result was discarded: {problem}")
        return model
    stats.optimizer_delta.update(op_counts(optimized))
    stats.optimizer_delta.subtract(op_counts(model))
    return result.into(model)


def _optimizer_damage(optimized: onnx.ModelProto, types: dict[str, onnx.TypeProto], stats: _SimplifyStatistics) -> str:
    """Repair what onnxoptimizer breaks (dropped interface types, subgraph initializers, order); what is left."""
    repair = restore_interface_types(optimized, types)
    for entry in repair.restored:
        stats.note(f"onnxoptimizer dropped the type of graph input/output '{entry}'; put back")
    if repair.conflicts:
        return f"it changed the types of {repair.conflicts}"
    subgraph_initializers_to_constants(optimized.graph)  # extract_constant_to_initializer enters subgraphs
    if scope_problems(optimized.graph):
        sort_topologically(optimized.graph)
    problems = scope_problems(optimized.graph)
    return "; ".join(problems)


def _findings(nodes_before: dict[str, int], model: onnx.ModelProto, config: SimplifyConfig, stats: _SimplifyStatistics,
              check: EquivalenceCheck | Unchecked) -> SimplifyFindings:
    nodes_after = op_counts(model)
    delta = {"removed": {op: -n for op, n in sorted(stats.optimizer_delta.items()) if n < 0},
             "added": {op: n for op, n in sorted(stats.optimizer_delta.items()) if n > 0}}
    rewrites = stats.rewrites.as_findings()
    changed = (["fold_constants"] if stats.folded_nodes else []) + \
        (["constants_to_initializers"] if stats.constants_converted else []) + \
        [name for name, count in rewrites["applied"].items() if count] + likely_passes(config.passes(), delta)
    return SimplifyFindings(
        nodes_before=nodes_before,
        nodes_after=nodes_after,
        node_count_before=sum(nodes_before.values()),
        node_count_after=sum(nodes_after.values()),
        folded_tensors=stats.folded_tensors,
        folded_nodes=stats.folded_nodes,
        folded=dict(sorted(stats.folded.items())[:MAX_LISTED]),
        constants_converted=stats.constants_converted,
        fold_skipped=sorted(stats.skipped.values(), key=lambda entry: entry["tensor"]),
        fold_failed_ops=sorted(stats.failed_ops),
        passes=config.passes(),
        rewrites=rewrites,
        optimizer={"calls": stats.optimizer_calls, **delta},
        passes_changed=changed,
        iterations=stats.iterations,
        seconds={phase: round(value, 4) for phase, value in sorted(stats.seconds.items())},
        check=check,
        notes=list(stats.notes),
    )

MAX_LISTED = 200
"""Folded tensors listed by name (with their bytes) in the findings; the count covers all."""

