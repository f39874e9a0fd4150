"""Budget mode: keep in float32 the fewest nodes that bring the fp16 artifact within a tolerance.

One gated emulation model (qdeploy.stages.fp16._emulate.gated_twin) is built once; every
trial is a run with a different boolean gate vector, never a new model.

1. Nodes are grouped: a pure data-movement node (Reshape, Transpose, ...) follows
   the node that produces its data, since its precision only matters at its edges.
2. Per-group sensitivity is measured: the output error when only that group runs in
   float16 and everything else in float32 (one trial per group).
3. Groups are kept in float32 in decreasing sensitivity; a binary search over how many
   (the accuracy-budget engine's ``prefix.bisect``) finds the fewest that meet the tolerance on all the samples.

The result is typed (``Float32Choice``); its report (``_budget_targets.Fp16Budget``) is written once, for the
findings.
The artifact is then confirmed on the recipe's targets by the engine (``_budget_targets``).

With a task metric (``tolerance: {metric, max_drop}``, ``qdeploy.stages.task_metric``) the groups are still
ranked by output error (one cheap trial each) and every decision is the metric's drop on all the samples.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

from qdeploy.core.compare import as_arrays, compare_outputs
from qdeploy.core.detections import consumed_outputs, match_detections
from qdeploy.graph.external_data import save_onnx
from qdeploy.stages.accuracy_budget.evaluate import Evaluator, Measured
from qdeploy.stages.accuracy_budget.prefix import bisect
from qdeploy.stages.fp16._emulate import GATES_INPUT, gated_twin
from qdeploy.stages.fp16._graph import FLOAT, subgraphs
from qdeploy.stages.task_metric import MetricComparison, TaskJudge, metric_summary

if TYPE_CHECKING:
    from collections.abc import Callable

    import numpy as np
    import onnx

    from qdeploy.core.compare import OutputComparison
    from qdeploy.core.tolerance import Tolerance

log = logging.getLogger(__name__)

DATA_MOVEMENT = frozenset({"Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "Identity", "Expand",
                           "Tile", "Slice", "Gather", "Split", "DepthToSpace", "SpaceToDepth"})
SENSITIVITY_SAMPLES = 4
LONG_SEARCH_SECONDS = 300
"""A search expected to take longer is announced as a warning."""

Outputs = list[dict[str, "np.ndarray"]]


class KeptGroupRecord(TypedDict):
    """A kept group in the budget's findings (``float32_nodes[]``): its nodes, its sensitivity ("inf": not finite)."""

    nodes: list[str]
    sensitivity: float | str | None


class SampleSearchRecord(TypedDict):
    """One sample's own search in the budget's findings (``per_sample[]``)."""

    met: bool
    metrics_all_float16: dict[str, float | None]
    metrics_chosen: dict[str, float | None] | None
    float32_groups: int


@dataclass(frozen=True)
class KeptGroup:
    """A node group kept float32 and its sensitivity (the loss with only it in float16; None: not measured)."""

    nodes: list[str]
    sensitivity: float | None

    def report(self) -> KeptGroupRecord:
        return {"nodes": self.nodes, "sensitivity": None if self.sensitivity is None else _json_float(self.sensitivity)}


@dataclass
class Float32Choice:
    """Which nodes budget mode keeps in float32 (the emulated search), and the evidence."""

    groups: int
    trials: int
    met: bool
    seconds: float
    all_float16: OutputComparison
    chosen: OutputComparison | None = None
    """The comparison of the chosen artifact; None when all float16 met the tolerance (or there is no group)."""
    kept: list[KeptGroup] = field(default_factory=list)
    ladder: list[list[str]] = field(default_factory=list)
    """Every node group, most sensitive first: what a target that misses keeps float32 next."""
    chosen_count: int = 0
    """How many groups of ``ladder`` the emulated search kept in float32."""
    per_sample: list[Float32Choice] | None = None
    """The searches on each sample alone, when the choice is their union (``_draws``)."""

    @property
    def float32_nodes(self) -> list[str]:
        return [name for group in self.kept for name in group.nodes]

    def report(self) -> dict[str, Any]:
        """The search's part of the budget's findings."""
        if self.per_sample is not None:
            return {"groups": self.groups, "searched": "each sample on its own", "trials": self.trials,
                    "met": self.met, "per_sample": [one.sample_report() for one in self.per_sample],
                    "float32_nodes": [group.report() for group in self.kept], "seconds": self.seconds}
        entry: dict[str, Any] = {"groups": self.groups, "metrics_all_float16": self.all_float16.worst(),
                                 **_task_record("all_float16", self.all_float16), "trials": self.trials,
                                 "met": self.met}
        if self.chosen is not None:
            entry.update(metrics_chosen=self.chosen.worst(), **_task_record("chosen", self.chosen))
        return {**entry, "seconds": self.seconds, "float32_nodes": [group.report() for group in self.kept]}

    def sample_report(self) -> SampleSearchRecord:
        return {"met": self.met, "metrics_all_float16": self.all_float16.worst(),
                "metrics_chosen": None if self.chosen is None else self.chosen.worst(),
                "float32_groups": len(self.kept)}


def node_groups(model: onnx.ModelProto, fixed_float32: set[str], types: dict[str, int]) -> list[list[str]]:
    """Candidate node groups of the main graph, in graph order; data-movement nodes join their producer's group."""
    producer = {out: node for node in model.graph.node for out in node.output if out}
    group_of: dict[str, int] = {}
    groups: list[list[str]] = []
    for node in model.graph.node:
        if node.name in fixed_float32 or node.op_type == "Constant" or not _touches_float(node, types):
            continue
        source = producer.get(node.input[0]) if node.input else None
        if node.op_type in DATA_MOVEMENT and source is not None and source.name in group_of:
            group = group_of[source.name]
        else:
            group = len(groups)
            groups.append([])
        groups[group].append(node.name)
        group_of[node.name] = group
    return groups


def _touches_float(node: onnx.NodeProto, types: dict[str, int]) -> bool:
    return bool(subgraphs(node)) or any(types.get(name) == FLOAT for name in (*node.input, *node.output) if name)


def choose_float32_nodes(model: onnx.ModelProto, groups: list[list[str]], float32_inputs: dict[str, set[int]],
                         feeds: list[dict[str, np.ndarray]], reference: Outputs, tolerance: Tolerance, *,
                         keep_io_types: bool, to_float16: Callable[[np.ndarray], np.ndarray],
                         work_dir: Path, judge: TaskJudge | None = None,
                         detections: Mapping[str, Any] | None = None) -> Float32Choice:
    """The fewest groups (by measured sensitivity) to keep in float32 so the emulated artifact meets `tolerance`
    (``judge``: the task metric's drop instead; ``detections``: a detector's outputs, matched by IoU)."""
    import numpy as np

    started = time.perf_counter()
    gate_of = {name: index for index, group in enumerate(groups) for name in group}
    trials = _Trials(gated_twin(model, gate_of, float32_inputs, keep_io_types, to_float16), feeds, reference,
                     tolerance, work_dir, judge, detections)
    everything = np.ones(len(groups), dtype=bool)
    trial_started = time.perf_counter()
    all_fp16 = trials.compare(everything)
    if all_fp16.passed or not groups:
        return Float32Choice(len(groups), trials.count, all_fp16.passed, _since(started), all_fp16)
    _announce(len(groups), time.perf_counter() - trial_started)
    sensitivity, order = _sensitivity(trials, len(groups))
    count, chosen = _fewest(order, trials, len(groups))
    log.info("fp16 budget: %d of %d node groups stay float32 after %d trials", count, len(groups), trials.count)
    return Float32Choice(len(groups), trials.count, chosen.passed, _since(started), all_fp16, chosen,
                         [KeptGroup(groups[index], sensitivity[index]) for index in order[:count]],
                         [groups[index] for index in order], count)


def rank_groups(model: onnx.ModelProto, groups: list[list[str]], float32_inputs: dict[str, set[int]],
                feeds: list[dict[str, np.ndarray]], reference: Outputs, tolerance: Tolerance, *, keep_io_types: bool,
                to_float16: Callable[[np.ndarray], np.ndarray], work_dir: Path,
                judge: TaskJudge | None = None, detections: Mapping[str, Any] | None = None) -> list[list[str]]:
    """The groups, most sensitive first (one emulated trial each): what a target that misses keeps float32
    first when the emulated search kept none and so measured no order."""
    gate_of = {name: index for index, group in enumerate(groups) for name in group}
    trials = _Trials(gated_twin(model, gate_of, float32_inputs, keep_io_types, to_float16), feeds, reference,
                     tolerance, work_dir, judge, detections)
    return [groups[index] for index in _sensitivity(trials, len(groups))[1]]


def _announce(groups: int, trial_seconds: float) -> None:
    """How long the search will take, from its first trial: one trial per group and a binary search.  A long one
    (LEADER's fingerprint network: 683 groups at 1.5 s a trial) is a warning that says how to avoid it."""
    seconds = (groups + math.ceil(math.log2(groups + 1)) + 1) * trial_seconds
    level = logging.WARNING if seconds > LONG_SEARCH_SECONDS else logging.INFO
    log.log(level, "fp16 budget: %d node groups, one trial each at %.2f s a trial: about %.0f s for this search "
            "(fp16 {repair: false} skips the repair's; node_block_list or op_block_list leaves fewer groups)",
            groups, trial_seconds, seconds)


def _sensitivity(trials: _Trials, count: int) -> tuple[list[float], list[int]]:
    """Per group, the loss with only it in float16; and the groups' order, most sensitive first."""
    import numpy as np

    sensitivity = [trials.loss(np.eye(count, dtype=bool)[index]) for index in range(count)]
    return sensitivity, sorted(range(count), key=lambda index: -sensitivity[index])


def _fewest(order: list[int], trials: _Trials, total: int) -> tuple[int, Any]:
    """Binary search (``prefix.bisect``) for the smallest count of most-sensitive groups whose blocking meets the
    tolerance."""
    import numpy as np

    def gates_blocking(count: int) -> np.ndarray:
        gates = np.ones(total, dtype=bool)
        gates[order[:count]] = False
        return gates

    measured = {total: trials.compare(gates_blocking(total))}  # blocking all (pure float32) is the fallback

    def passes(count: int) -> bool:
        measured[count] = trials.compare(gates_blocking(count))
        return measured[count].passed

    count = bisect(passes, 0, total)  # blocking none fails; all is the fallback, measured even when it fails
    return count, measured[count]


class _Trials:
    """Runs of the gated model: one session, a gate vector per trial, each judged by the accuracy-budget engine's
    evaluator (output tolerance over all samples pooled, or the task metric)."""

    def __init__(self, twin: onnx.ModelProto, feeds: list[dict[str, np.ndarray]], reference: Outputs,
                 tolerance: Tolerance, work_dir: Path, judge: TaskJudge | None = None,
                 detections: Mapping[str, Any] | None = None) -> None:
        import onnxruntime as ort

        path = work_dir / "fp16_budget.onnx"
        save_onnx(twin, path)  # with external data above protobuf's 2 GB limit
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        self.session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        self.names = [value.name for value in twin.graph.output]
        self.feeds = feeds
        self.reference = reference
        self.detections = detections
        self.judging = Evaluator(None, feeds, [], tolerance, work_dir, reference=Measured(reference, []),
                                 label="emulation", judge=judge, detections=detections,
                                 compare=compare_outputs)
        self.count = 0

    def run(self, gates: np.ndarray, feeds: list[dict[str, np.ndarray]]) -> Outputs:
        self.count += 1
        return [as_arrays(self.names, self.session.run(self.names, {**feed, GATES_INPUT: gates})) for feed in feeds]

    def compare(self, gates: np.ndarray) -> OutputComparison:
        return self.judging.on_search(Measured(self.run(gates, self.feeds)))

    def loss(self, gates: np.ndarray) -> float:
        """Largest relative L2 error over outputs and samples (inf when a value is not finite); a detector's
        matched outputs (``detections``) count the share of boxes unmatched, an output of another length 1."""
        import numpy as np

        count = min(SENSITIVITY_SAMPLES, len(self.feeds))
        worst = 0.0
        matched = consumed_outputs(self.detections)
        for got, want in zip(self.run(gates, self.feeds[:count]), self.reference[:count], strict=True):
            if self.detections:
                found, _ = match_detections(self.detections, [want], [got])
                worst = max(worst, 1.0 - min(found.get("recall", 0.0), found.get("precision", 0.0)))
            for name, expected in want.items():
                if name in matched or not np.issubdtype(expected.dtype, np.floating):
                    continue
                actual = got[name].astype(np.float64)
                if not np.isfinite(actual).all():
                    return math.inf
                if actual.shape != expected.shape:  # a selection's length moved: as far off as it gets
                    worst = max(worst, 1.0)
                    continue
                scale = float(np.linalg.norm(expected)) or 1.0
                worst = max(worst, float(np.linalg.norm(actual - expected)) / scale)
        return worst


def _task_record(which: str, comparison: Any) -> dict[str, Any]:
    """The task metric's record of a trial (``task_metric_<which>``), when it decided."""
    return {f"task_metric_{which}": metric_summary(comparison)} if isinstance(comparison, MetricComparison) else {}


def _json_float(value: float) -> float | str:
    return value if math.isfinite(value) else "inf"


def _since(started: float) -> float:
    return round(time.perf_counter() - started, 3)
