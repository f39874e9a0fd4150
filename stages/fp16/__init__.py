"""The fp16 stage: convert a float32 model to float16 with onnxconverter-common, deliberately.

onnxconverter-common converts; around it this stage
- types every tensor first (qdeploy.stages.fp16._types: inference by path for > 2 GB models,
  subgraphs, ORT for contrib ops) and refuses, naming it, a tensor it cannot type;
- keeps in float32 what must stay float32 by the ONNX and ONNX Runtime schemas (qdeploy.stages.fp16._rules),
  and, found without data, normalisations written out op by op, integer accumulators, accumulating scatters
  and constants beyond float16's range (qdeploy.stages.fp16._patterns);
- with data (`calibration`, or by default the recipe's validation dataset), keeps in float32
  the nodes whose activations would overflow float16, by measured ranges and known overflow
  patterns (qdeploy.stages.fp16._activations), and, in `mode: auto`, the fewest further nodes that
  meet a tolerance, by measured per-node sensitivity (qdeploy.stages.fp16._budget);
- makes the converted model's types consistent (qdeploy.stages.fp16._repair): one Cast per tensor,
  a copy per precision of shared constants, Casts in the graph that owns the tensor,
  no redundant Cast pairs, topological order, unique names;
- checks the artifact's fidelity with float16 arithmetic emulated on ORT (or onnx's
  reference evaluator), blocking nodes that still overflow; in mode 'fixed' a check that misses the
  tolerance, or meets it by less than `headroom_db` (qdeploy.stages.fp16._headroom), is repaired by the
  budget's search aiming at the tolerance with headroom; then runs onnx.checker (full), loads it in ORT and
  runs a sample there (keeping float32 the fewest nodes that make it load and run: qdeploy.stages.fp16._loadable).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from qdeploy.core.context import Artifact, StageContext, StageResult
from qdeploy.core.errors import StageError
from qdeploy.core.memory import release_memory
from qdeploy.core.tolerance import DEFAULT_TOLERANCES, TaskTolerance, Tolerance
from qdeploy.graph.measured_integers import measured_integer_outputs, with_integer_values
from qdeploy.graph.names import name_nodes_uniquely
from qdeploy.graph.widen import widen_cast_weights
from qdeploy.stages.fp16._activations import overflowing_nodes, run_float32
from qdeploy.stages.fp16._budget import choose_float32_nodes, node_groups
from qdeploy.stages.fp16._budget_targets import Fp16Budget, confirm_budget
from qdeploy.stages.fp16._convert import (
    STAGE,
    already_float16,
    check,
    constant_outputs_behind_identity,
    convert,
    count_clamping,
    float16_clamper,
    written_for_check,
)
from qdeploy.stages.fp16._draws import choose_for_every_draw, missed_by_samples, sample_snrs
from qdeploy.stages.fp16._fidelity import (
    EMULATED,
    Fp16Fidelity,
    comparison_record,
    overflow_births,
    reference_check,
    run_emulated,
)
from qdeploy.stages.fp16._graph import subgraphs, walk_nodes
from qdeploy.stages.fp16._headroom import headroom_findings, with_headroom
from qdeploy.stages.fp16._loadable import fewest_for_loading
from qdeploy.stages.fp16._offload import offload, reload, worth_offloading
from qdeploy.stages.fp16._patterns import (
    integer_accumulators,
    normalizations,
    out_of_range_constants,
    scatter_reductions,
)
from qdeploy.stages.fp16._repair import PrecisionPlan, TypeRepair
from qdeploy.stages.fp16._rules import Float32Needs, float32_needs
from qdeploy.stages.fp16._types import INFERENCE_BY_PATH_BYTES, all_types, float16_compute_nodes, load_typed
from qdeploy.stages.fp16.config import (
    MAX_SAFETY_ROUNDS,
    REPAIR_SAMPLES,
    Fp16Config,
    Fp16Data,
    effective_op_block_list,
    reads_default_dataset,
)
from qdeploy.stages.fp16.findings import (
    ActivationAnalysis,
    CastRepairRecord,
    Fp16Findings,
    KeptNode,
    LoadRepairRecord,
)
from qdeploy.stages.task_metric import TaskJudge, judged, task_for
from qdeploy.targets.ort_probe import load_error

if TYPE_CHECKING:
    import numpy as np
    import onnx

    from qdeploy.stages.fp16._activations import Float32Run
    from qdeploy.stages.fp16._repair import RepairReport

__all__ = ["Fp16Config", "run"]

log = logging.getLogger(__name__)

def _data(config: Fp16Config, ctx: StageContext) -> Fp16Data | None:
    """The data the stage measures on: its own 'calibration', else the validation dataset, else none."""
    if config.calibration is not None:
        return config.calibration
    if reads_default_dataset(config) and ctx.default_dataset is not None:
        return Fp16Data(data=ctx.default_dataset)
    return None


def run(artifact: Artifact, config: Fp16Config, ctx: StageContext) -> StageResult:
    """Convert the artifact's model to float16; returns the converted model and what was done."""
    started = time.perf_counter()
    big = artifact.size_bytes >= INFERENCE_BY_PATH_BYTES
    ctx.on_progress("fp16: types")
    model = load_typed(artifact.path, artifact.size_bytes, ctx.work_dir)
    widened = widen_cast_weights(model)  # half weights cast to float32 (simplify keeps them narrow): converted
    if widened:                          # as the float32 weights they stand for, not refused as float16
        log.info("fp16: %d float16/bfloat16 weight(s) cast to float32 in the model converted as float32 weights",
                 len(widened))
    _refuse_float16(model, ctx)
    name_nodes_uniquely(model)
    _check_node_names(model, config.node_block_list, ctx)
    constant_outputs = constant_outputs_behind_identity(model)  # kept float32 where the outputs stay float32
    types = all_types(model)
    needs = float32_needs(model, types)
    op_block = effective_op_block_list(config.op_block_list)
    patterns = _static_patterns(model, config, types)
    op_blocked = _op_blocked(model, op_block)
    fixed = op_blocked | set(config.node_block_list) | set(needs.nodes) | {n for found in patterns.values()
                                                                           for n in found}
    fixed |= set(constant_outputs) if config.keep_io_types else set()
    schema_inputs = [reason for node, reason in needs.input_reasons.items() if node not in fixed]
    conversion = _Fp16Conversion(model, config, ctx, needs, types, big)
    del model  # the conversion holds it (and may swap its weights out to disk: no second holder may keep them)
    data = _data(config, ctx)
    if data is not None:
        conversion.analyse(artifact, fixed, data)
    conversion.convert(fixed)
    if data is not None and config.fidelity_check != "off":
        conversion.safety_rounds(fixed)
        if config.mode == "fixed" and config.repair and not conversion.within_headroom():
            conversion.keep_for_tolerance(fixed)
    if config.onnxruntime_check and not big:  # before the targets' checks, which load it in this process
        conversion.make_loadable(fixed, refresh=data is not None and config.fidelity_check != "off")
    if conversion.budget is not None and ctx.targets:
        confirm_budget(conversion, fixed)  # held where it will be validated, not only in the emulation
    converted = conversion.converted
    clamp = count_clamping(conversion.model, converted, conversion.repair.initializer_copies, conversion.float32_scope,
                           config.min_positive_val, config.max_finite_val)
    found = {"activation_analysis": conversion.activation_analysis, "kept_in_fp32": conversion.kept,
             "budget": None if conversion.budget is None else conversion.budget.report(),
             "fidelity": conversion.fidelity, "load_repair": conversion.load_repair,
             "node_block_list": sorted(conversion.blocked - op_blocked), "clamp": clamp,
             "repair": _repair_findings(conversion.repair)}
    loaded = conversion.loaded is converted  # this very model loaded in make_loadable: no second load
    del conversion  # the float32 weights are not needed by the checks: large models need the memory back
    float16_nodes = float16_compute_nodes(converted)
    if not float16_nodes:
        log.warning("fp16 (%s): %s", ctx.variant, _nothing_in_float16(found["budget"]))
    cast_nodes = sum(node.op_type == "Cast" for node, _ in walk_nodes(converted.graph))
    converted, source = written_for_check(converted, ctx.work_dir, big=big)
    checker = check(converted, source, ctx.variant, onnxruntime_check=config.onnxruntime_check, loaded=loaded)
    findings = Fp16Findings(keep_io_types=config.keep_io_types, op_block_list=op_block,
                            schema_float32_nodes=needs.nodes, schema_float32_inputs=schema_inputs, **patterns,
                            **found, cast_nodes=cast_nodes, float16_compute_nodes=float16_nodes, checker=checker,
                            seconds=round(time.perf_counter() - started, 3))
    return StageResult(model=converted, changed=True, findings=findings)


def _nothing_in_float16(budget: dict[str, Any] | None) -> str:
    """Why no node of the artifact computes in float16, and what to do: it is the float32 model under the fp16
    variant's name (unidic-lite's tagger: the search kept all 125 groups for an ArgMax's near-ties)."""
    if budget is not None:
        why = "meeting the tolerance kept every node float32" + (f" ({budget['trigger']})" if budget.get("trigger")
                                                                 else "")
    else:
        why = ("the block lists and the ops that need float32 cover every node, or the model holds no float32 "
               "computation (float64 trees, integer ops)")
    return (f"no node computes in float16: {why}; the artifact is the float32 model under the variant's name. An "
            "output that selects by value (ArgMax, TopK) flips at near-ties: allow a share to differ "
            "(validate.outputs.<name>.mismatch_max) or judge with a task metric (fp16.tolerance.metric); else drop "
            "the fp16 variant")


def _load_failure(error: str) -> str:
    """How ONNX Runtime failed the float16 model, as ``ort_probe.load_error`` said it: '... the model'."""
    running = "running" in error
    if "crashed" in error:
        return "crashes running a sample of" if running else "crashes loading"
    return "fails running a sample of" if running else "fails to load"


NO_DATA = ("not run: no calibration data in the fp16 config and no validation dataset in the recipe (or "
           "use_validation_data: false)")
"""The activation analysis without data."""


def _static_patterns(model: onnx.ModelProto, config: Fp16Config, types: dict[str, int]) -> dict[str, dict[str, str]]:
    """Nodes kept float32 by graph patterns found without data, per findings key: node -> why."""
    return {
        "normalization_float32_nodes": normalizations(model) if config.keep_layer_norms_float32 else {},
        "integer_accumulator_float32_nodes": integer_accumulators(model, types),
        "scatter_reduction_float32_nodes": scatter_reductions(model),
        "constant_range_float32_nodes": (out_of_range_constants(model, config.max_finite_val)
                                         if config.out_of_range_constants == "keep_float32" else {}),
    }


def _refuse_float16(model: onnx.ModelProto, ctx: StageContext) -> None:
    present = already_float16(model)
    if present:
        raise StageError(STAGE, ctx.variant, f"the model already holds float16 tensors or Casts ({present[:5]}); "
                                             "converting again would stack clamping and Casts: give the stage the "
                                             "float32 model, or drop the fp16 step (the model's own variant runs "
                                             "it in float16 already)")


def _check_node_names(model: onnx.ModelProto, names: list[str], ctx: StageContext) -> None:
    present = {node.name for node, _ in walk_nodes(model.graph)}
    unknown = [name for name in names if name not in present]
    if unknown:
        raise StageError(STAGE, ctx.variant, f"node_block_list names {unknown} that are not in the model; "
                                             f"some of its nodes: {sorted(present)[:20]}")


def _op_blocked(model: onnx.ModelProto, op_block: list[str]) -> set[str]:
    blocked_ops = set(op_block)
    return {node.name for node, _ in walk_nodes(model.graph) if node.op_type in blocked_ops}


def _with_nested(model: onnx.ModelProto, names: set[str]) -> set[str]:
    """The names plus every node inside the subgraphs of those nodes (they run in float32 with them)."""
    result = set(names)
    for node, _ in walk_nodes(model.graph):
        if node.name in result:
            for sub in subgraphs(node):
                result.update(inner.name for inner, _ in walk_nodes(sub))
    return result


def _repair_findings(report: RepairReport) -> CastRepairRecord:
    return {"casts_added": report.casts, "redundant_casts_removed": report.casts_removed,
            "initializer_copies": report.initializer_copies, "constant_copies": report.constant_copies,
            "type_attributes_rewritten": report.attributes, "outputs_retyped": report.outputs_retyped}


class _Fp16Conversion:
    """One run of the stage: the typed float32 model, the data, and the conversion as it evolves."""

    def __init__(self, model: onnx.ModelProto, config: Fp16Config, ctx: StageContext, needs: Float32Needs,
                 types: dict[str, int], big: bool) -> None:
        self.model = model
        self.config = config
        self.ctx = ctx
        self.needs = needs
        self.types = types
        self.big = big
        self.to_float16 = float16_clamper(config.min_positive_val, config.max_finite_val)
        self.feeds: list[dict[str, np.ndarray]] = []
        self.float32: Float32Run | None = None
        self.kept: list[KeptNode] = []
        self.blocked: set[str] = set()
        self.float32_scope: set[str] = set()
        self.activation_analysis: str | ActivationAnalysis = NO_DATA
        self.budget: Fp16Budget | None = None
        """The budget's search and target checks (typed; the findings' record is its ``report``), once one ran."""
        self.fidelity: Fp16Fidelity | None = None
        """The last checks' records (report-only), once they ran."""
        self.emulated_reasons: list[str] = []  # what the last emulated check missed of the tolerance
        self.emulated_passed = False
        self.target_reasons: list[str] = []  # what the last emulated check missed of the target (with headroom)
        self.converted: onnx.ModelProto
        self.repair: Any = None
        self.judge: TaskJudge | None = None
        """The task metric that decides the budget (``tolerance: {metric, max_drop}``), once the data is read."""
        self.loaded: onnx.ModelProto | None = None
        """The converted model ONNX Runtime last loaded (``make_loadable``)."""
        self.load_repair: LoadRepairRecord | None = None
        self.measured = measured_integer_outputs(model)
        """Integer outputs the graph casts from float values, compared as values (``graph.measured_integers``)."""

    @property
    def tolerance(self) -> Tolerance:
        """The output limits; a task metric's budget checks outputs by the fp16 defaults beside it."""
        tolerance = self.config.tolerance
        return with_integer_values(tolerance if isinstance(tolerance, Tolerance) else DEFAULT_TOLERANCES["fp16"],
                                   self.measured)

    @property
    def target(self) -> Tolerance:
        """What the check and the repair aim at in mode 'fixed': the tolerance with headroom (``_headroom``)."""
        return with_headroom(self.tolerance, self.config.headroom_db)

    def within_headroom(self) -> bool:
        """Whether the last emulated check met the target (the verdict stays on the tolerance)."""
        return self.emulated_passed and not self.target_reasons

    def analyse(self, artifact: Artifact, fixed: set[str], data: Fp16Data) -> None:
        """Run float32 on the data; keep overflowing nodes; in auto mode, also the budget's choice."""
        self.ctx.on_progress("fp16: activation ranges")
        self.feeds = list(self.ctx.samples(data.data, artifact.path, data.samples))
        if isinstance(self.config.tolerance, TaskTolerance):
            inputs = [value.name for value in self.model.graph.input
                      if value.name not in {init.name for init in self.model.graph.initializer}]
            function, labels = task_for(self.config.tolerance, "fp16.tolerance.metric", self.ctx.datasets,
                                        self.ctx.resolve, data.data, inputs, len(self.feeds))
            self.judge = TaskJudge(function, self.config.tolerance, labels, len(self.feeds))
        with self._float32_weights_on_disk():  # the probe, written beside them, reads them from there
            self.float32 = run_float32(self.model, self.feeds, self.ctx.work_dir, big=self.big)
        limit_note = {"safety_margin": self.config.safety_margin, "max_finite_val": self.config.max_finite_val}
        self.kept = overflowing_nodes(self.model, self.float32.stats, self.config.max_finite_val,
                                      self.config.safety_margin, fixed)
        source = "calibration" if self.config.calibration is not None else "validate.data (default)"
        self.activation_analysis = {"data": data.data or "seeded random", "source": source,
                                    "samples": len(self.feeds), **limit_note}
        if self.kept:
            log.info("variant %s: %d nodes stay float32 for their activation ranges", self.ctx.variant,
                     len(self.kept))
        if self.config.mode == "auto":
            self._budget(fixed | {entry["node"] for entry in self.kept})

    @contextlib.contextmanager
    def _float32_weights_on_disk(self) -> Iterator[None]:
        """While an ORT session holds its own weights, the float32 model's wait on disk (``_offload``)."""
        if not worth_offloading(self.model):
            yield
            return
        self.model, offloaded = offload(self.model, self.ctx.work_dir)
        release_memory()  # the full message may sit in a reference cycle: free its weights before the session
        try:
            yield
        finally:
            release_memory()  # the closed session's and the run's freed memory, before the weights come back
            reload(self.model, offloaded)

    def keep_for_tolerance(self, fixed: set[str]) -> None:
        """The emulated check missed the tolerance or its headroom: budget mode's search for further float32
        nodes that meet the target (the tolerance with headroom), then the checks again."""
        missed = self.emulated_reasons or self.target_reasons
        what = "check missed" if self.emulated_reasons else f"check missed its {self.config.headroom_db:g} dB headroom"
        log.info("variant %s: float16 emulation %s (%s); searching nodes to keep in float32",
                 self.ctx.variant, what, "; ".join(missed))
        self._budget(fixed | {entry["node"] for entry in self.kept}, limit=REPAIR_SAMPLES, tolerance=self.target,
                     every_draw=True)
        assert self.budget is not None  # _budget wrote it
        self.budget.trigger = f"repair: the float16 emulation {what} ({'; '.join(missed)})"
        self.convert(fixed)
        self.safety_rounds(fixed)

    def _budget(self, float32: set[str], limit: int | None = None, tolerance: Tolerance | None = None,
                every_draw: bool = False) -> None:
        """Budget mode's search; ``every_draw``: each sample must meet ``tolerance`` on its own (``_draws``)."""
        assert self.float32 is not None
        groups = node_groups(self.model, _with_nested(self.model, float32), self.types)
        searches = f", a search per sample of {len(self.feeds[:limit])}" if every_draw else ""
        self.ctx.on_progress(f"fp16: per-node sensitivity ({len(groups)} node groups{searches})")
        judge = self.judge if tolerance is None else None  # the repair aims at output limits with headroom
        tolerance = tolerance or self.tolerance
        result = (choose_for_every_draw if every_draw else choose_float32_nodes)(
            self.model, groups, self.needs.inputs, self.feeds[:limit], self.float32.outputs[:limit], tolerance,
            keep_io_types=self.config.keep_io_types, to_float16=self.to_float16, work_dir=self.ctx.work_dir,
            detections=self.ctx.detections, **({"judge": judge} if judge else {}))
        self.kept.extend({"node": name, "op_type": self._op_type(name), "reason": "budget: sensitivity"}
                         for name in result.float32_nodes)
        aim = self.config.tolerance if judge else tolerance
        self.budget = Fp16Budget(aim.model_dump(exclude_none=True), result, groups)  # groups: when a target misses

    def _op_type(self, name: str) -> str:
        return next((node.op_type for node, _ in walk_nodes(self.model.graph) if node.name == name), "?")

    def convert(self, fixed: set[str], trial: frozenset[str] = frozenset()) -> None:
        """Convert with everything decided so far (and the ``trial`` nodes) kept in float32, then repair the
        types."""
        self.ctx.on_progress("fp16: converting")
        self.blocked = fixed | {entry["node"] for entry in self.kept} | trial
        self.float32_scope = _with_nested(self.model, self.blocked)
        converted = convert(self.model, min_positive_val=self.config.min_positive_val,
                            max_finite_val=self.config.max_finite_val, keep_io_types=self.config.keep_io_types,
                            op_block_list=effective_op_block_list(self.config.op_block_list),
                            node_block_list=sorted(self.blocked), variant=self.ctx.variant)
        plan = PrecisionPlan(float32_nodes=self.float32_scope, float32_inputs=self.needs.inputs,
                    keep_io_types=self.config.keep_io_types)
        self.repair = TypeRepair(self.model, plan, self.to_float16, self.types).apply(converted)
        self.converted = converted

    def make_loadable(self, fixed: set[str], *, refresh: bool) -> None:
        """ONNX Runtime must load the artifact and run a sample the float32 model ran: where it does not (an
        error, a crash of its optimisations, a kernel that refuses at run time), keep float32 the fewest nodes
        that make it load and run (``_loadable``), convert again and, with ``refresh``, emulate it again for the
        fidelity record."""
        self.ctx.on_progress("fp16: loading in ONNX Runtime")
        error = load_error(self.converted, self._probe_feed())
        if error is not None:
            self._keep_for_loading(fixed, error)
            if refresh:
                self.safety_rounds(fixed)
            if self.converted is not self.loaded and (error := load_error(self.converted,
                                                                          self._probe_feed())) is not None:
                raise StageError(STAGE, self.ctx.variant, f"the fp16 model does not load and run in ONNX Runtime: "
                                 f"{error}; keep the nodes involved float32 (node_block_list)")
        self.loaded = self.converted

    def _probe_feed(self) -> dict[str, np.ndarray] | None:
        """The first sample, which the float32 model ran: a failure on it is the float16 model's."""
        return self.feeds[0] if self.feeds and self.float32 is not None else None

    def _keep_for_loading(self, fixed: set[str], error: str) -> None:
        log.info("variant %s: ONNX Runtime does not load the float16 model (%s); searching nodes to keep in "
                 "float32", self.ctx.variant, error)
        order = {name: index for index, (node, _) in enumerate(walk_nodes(self.model.graph))
                 if (name := node.name) not in self.float32_scope}
        op_types = {node.name: node.op_type for node, _ in walk_nodes(self.model.graph)}
        candidates = sorted(order, key=lambda name: (op_types[name], order[name]))

        def loads(nodes: list[str]) -> bool:
            self.ctx.on_progress(f"fp16: loading in ONNX Runtime with {len(nodes)} nodes float32")
            self.convert(fixed, frozenset(nodes))
            return load_error(self.converted, self._probe_feed()) is None

        search = fewest_for_loading(candidates, loads)
        if search is None:
            raise StageError(STAGE, self.ctx.variant, f"the fp16 model does not load and run in ONNX Runtime: "
                             f"{error} (and keeping every converted node float32 does not make it load either)")
        how = _load_failure(error)
        self.kept.extend({"node": name, "op_type": op_types[name],
                          "reason": f"onnxruntime load: ONNX Runtime {how} the model with it float16"}
                         for name in search.nodes)
        self.load_repair = search.record(error)
        self.convert(fixed)
        self.loaded = self.converted

    def safety_rounds(self, fixed: set[str]) -> None:
        """Emulate the artifact in float16; keep nodes where Inf/NaN is born, reconvert; then report fidelity."""
        assert self.float32 is not None
        originals = {node.name for node, _ in walk_nodes(self.model.graph)}
        for _ in range(MAX_SAFETY_ROUNDS):
            self.ctx.on_progress("fp16: float16 emulation")
            started = time.perf_counter()
            with self._float32_weights_on_disk():
                emulated = run_emulated(self.converted, self.feeds, self.float32.stats, self.ctx.work_dir)
            births = overflow_births(self.converted, emulated.nonfinite, originals, self.blocked,
                                     self.float32.stats)
            if not births:
                break
            log.info("variant %s: float16 emulation overflows at %s; keeping them in float32", self.ctx.variant,
                     [entry["node"] for entry in births])
            self.kept.extend(births)
            self.convert(fixed)
        else:
            raise StageError(STAGE, self.ctx.variant, "float16 emulation still overflows after "
                             f"{MAX_SAFETY_ROUNDS} rounds of keeping nodes in float32; last kept: {self.kept[-3:]}")
        comparison = judged(self.float32.outputs, emulated.outputs, self.tolerance, self.judge, self.ctx.detections)
        self.emulated_passed, self.emulated_reasons = comparison.passed, comparison.reasons
        self.target_reasons = [] if self.judge else missed_by_samples(self.float32.outputs, emulated.outputs,
                                                                      self.target, self.ctx.detections)
        record = comparison_record(EMULATED, comparison, len(emulated.outputs), time.perf_counter() - started)
        record["headroom"] = headroom_findings(self.config.headroom_db, self.target, self.within_headroom(),
                                               sample_snrs(self.float32.outputs, emulated.outputs))
        fidelity: Fp16Fidelity = {"emulated": record}
        broken = sorted(emulated.nonfinite & {value.name for value in self.converted.graph.output})
        if broken:
            raise StageError(STAGE, self.ctx.variant, f"under float16 emulation the outputs {broken} hold Inf/NaN "
                             "where float32 does not, and no further node to keep in float32 was "
                             f"found (kept: {[entry['node'] for entry in self.kept]}); add the nodes feeding "
                             "those outputs to node_block_list")
        if self.config.fidelity_check == "reference":
            self.ctx.on_progress("fp16: reference evaluator")
            fidelity["reference"] = reference_check(self.converted, self.feeds, self.float32.outputs,
                                                    self.tolerance, self.ctx.detections)
        self.fidelity = fidelity

