"""The fp16 budget's artifact confirmed on every target of the recipe, as validation will run it there.

Budget mode searches on an emulation of float16 (one gated ONNX Runtime model, ``_budget``).  The converted
artifact is then confirmed by the accuracy-budget engine (``qdeploy.stages.accuracy_budget.targets``): run on each
target of the recipe through that target's adapter at the precision validation runs an fp16 artifact (the
device's default: bfloat16 float parts on an OpenVINO CPU with AVX512-BF16; ONNX Runtime's CPU casts around the
ops it has no float16 kernel for), on the budget's samples, against float32 with the real tolerance, with the one
pinned-precision fallback validation uses.  Where validation also checks fp16 artifacts on reference:cpu (true
float16 arithmetic, when the recipe has no GPU: ``qdeploy.targets.true_fp16_check``), that check is one of the
targets, on its first ``REFERENCE_SAMPLES`` samples.  Each target ends ``confirmed``, ``missed`` (with its metrics)
or ``unavailable`` (the reason; never a CPU standing in for a GPU).  When a target misses, the groups the
emulation ranked next are kept float32 too, by the engine's bisection (``prefix``) measured on that target (and
on ort:cpu when the recipe has it, so a kept set still holds where it held), until the tolerance holds there or
every group is float32 and it still misses: then the artifact that held before is written and the target stays
``missed``, with the reason.

What fp16 supplies: how to build the artifact with further nodes float32 (``convert``) and its candidate groups,
most sensitive first (the ladder).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, NotRequired, TypedDict

from qdeploy.core.compare import compare_outputs
from qdeploy.stages.accuracy_budget.evaluate import Evaluator, Measured
from qdeploy.stages.accuracy_budget.findings import TargetRecord
from qdeploy.stages.accuracy_budget.prefix import bisect
from qdeploy.stages.accuracy_budget.targets import SEARCH_TARGET, UNAVAILABLE, TargetChecks, plan_targets
from qdeploy.stages.fp16._budget import Float32Choice, rank_groups
from qdeploy.targets import TRUE_FP16_TARGET

if TYPE_CHECKING:
    import numpy as np
    import onnx

    from qdeploy.core.tolerance import Tolerance
    from qdeploy.stages.task_metric import TaskJudge

REFERENCE_SAMPLES = 2
"""Samples run on reference:cpu (true float16, onnx's evaluator: seconds per sample), as validation's
``fp16_reference_samples`` default."""
EMULATION = "emulation (ort:cpu, gated float16 twin)"
"""The runtime the emulated search ran on, as the budget's ``runtimes`` names it."""
Outputs = list[dict[str, "np.ndarray"]]


def target_checks(targets: Sequence[str], feeds: list[dict[str, np.ndarray]], reference: Outputs,
                  tolerance: Tolerance, work_dir: Path, on_progress: Callable[[str], None] = lambda message: None,
                  judge: TaskJudge | None = None, detections: Mapping[str, Any] | None = None) -> TargetChecks:
    """The engine's per-target confirmation for an fp16 artifact: every sample is a search sample (the emulation
    already chose on them), compared pooled as fp16's checks compare; ort:cpu through its adapter."""
    base = Evaluator(None, feeds, [], tolerance, work_dir, reference=Measured(reference, []), label=EMULATION,
                     judge=judge, compare=compare_outputs, detections=detections)
    plans = plan_targets(targets, None, search_session=False, samples={TRUE_FP16_TARGET: REFERENCE_SAMPLES})
    return TargetChecks(base, plans, on_progress, searched_here=False)


class LadderPhaseRecord(TypedDict):
    """A search after a target missed, in the budget's findings (``phases[]``)."""

    searched_on: str
    met_there: bool
    float32_groups: int
    written: NotRequired[str]


class EvaluationCost(TypedDict):
    """What one runtime cost the budget (``runtimes``): evaluations and seconds."""

    evaluations: int
    seconds: float


class FlatTargetRecord(TypedDict, total=False):
    """A target's record as fp16's findings hold it (``targets``): the status, the metrics on all samples beside it
    (the task metric's when it decided), and the engine record's notes; ``status`` and ``reason`` alone when
    unavailable."""

    status: str
    precision: str | None
    cosine: float | None
    snr_db: float | None
    max_abs_err: float | None
    metric: float | None
    reference_metric: float | None
    drop: float | None
    allowed_drop: float | None
    reasons: list[str]
    reason: str | None
    deploy_precision: str
    note: str
    pinned: list[str]
    default: FlatTargetRecord


class TargetsReport(TypedDict, total=False):
    """The budget's target part of the findings; ``note`` only when a target missed."""

    phases: list[LadderPhaseRecord]
    target_float32_groups: int
    note: str
    targets: dict[str, FlatTargetRecord]
    runtimes: dict[str, EvaluationCost]


@dataclass
class LadderPhase:
    """One search after a target missed: where it searched, whether it held there, the groups it kept."""

    searched_on: str
    met_there: bool
    float32_groups: int
    written: str | None = None

    def report(self) -> LadderPhaseRecord:
        entry: LadderPhaseRecord = {"searched_on": self.searched_on, "met_there": self.met_there,
                                    "float32_groups": self.float32_groups}
        return {**entry, "written": self.written} if self.written is not None else entry


@dataclass
class TargetsOutcome:
    """What confirming on the targets found: each target's record, the searches after a miss, the cost."""

    checks: TargetChecks
    phases: list[LadderPhase] = field(default_factory=list)
    float32_groups: int = 0
    missed: list[str] = field(default_factory=list)

    @property
    def note(self) -> str | None:
        if not self.missed:
            return None
        written = (self.phases[-1].written or "the measured artifact") if self.phases else "the artifact"
        return f"budget not met on {', '.join(self.missed)}; {written} is written and marked as failing there"

    def report(self) -> TargetsReport:
        """The budget's target part of the report: ``phases``, ``target_float32_groups``, ``note``, ``targets`` (each
        record flat, as fp16 reports it) and ``runtimes``."""
        found: TargetsReport = {"phases": [phase.report() for phase in self.phases],
                                "target_float32_groups": self.float32_groups}
        if self.note:
            found["note"] = self.note
        runtimes: dict[str, EvaluationCost] = {
            name: {"evaluations": entry.evaluations, "seconds": entry.seconds}
            for name, entry in self.checks.cost().items()}
        return {**found, "targets": {name: flat_record(record) for name, record in self.checks.verdicts().items()},
                "runtimes": runtimes}


@dataclass
class Fp16Budget:
    """The fp16 stage's budget: the tolerance aimed at, the emulated choice, why it ran (a repair), and what the
    recipe's targets said; ``report`` writes the findings' ``budget`` once."""

    tolerance: dict[str, float | str]
    """The limits aimed at (a ``Tolerance``'s, or a ``TaskTolerance``'s with its metric), as the report holds them."""
    choice: Float32Choice
    groups: list[list[str]]
    trigger: str | None = None
    targets: TargetsOutcome | None = None

    @property
    def met(self) -> bool:
        return self.choice.met and (self.targets is None or self.targets.note is None)

    def report(self) -> dict[str, Any]:
        budget = {"tolerance": self.tolerance, **self.choice.report()}
        if self.trigger is not None:
            budget["trigger"] = self.trigger
        if self.targets is None:
            return budget
        found = self.targets.report()
        emulation = {"evaluations": self.choice.trials, "seconds": self.choice.seconds}
        return {**budget, **found, "met_emulated": self.choice.met, "met": self.met,
                "runtimes": {EMULATION: emulation, **found["runtimes"]}}


def flat_record(record: TargetRecord) -> FlatTargetRecord:
    """A target's record as fp16's findings hold it: the metrics on all samples beside the status."""
    if record.status == UNAVAILABLE:
        return {"status": UNAVAILABLE, "reason": record.reason}
    search = record.search or {}
    task = {key: search.get(key) for key in ("metric", "reference_metric", "drop", "allowed_drop")}
    flat: FlatTargetRecord = {"status": record.status, "precision": record.precision,
                            **{key: search.get(key) for key in ("cosine", "snr_db", "max_abs_err")},
                            **(task if "drop" in search else {}), "reasons": search.get("reasons", [])}
    extra = record.model_dump(include={"reason", "deploy_precision", "note", "pinned"}, exclude_none=True)
    if record.default is not None:
        extra["default"] = flat_record(record.default)
    return {**flat, **extra}


def hold_on_targets(checks: TargetChecks, current: onnx.ModelProto, convert: Callable[[list[str]], onnx.ModelProto],
                    ladder: Callable[[], tuple[list[list[str]], int]]) -> TargetsOutcome:
    """Confirm ``current`` on every target; on a miss, keep float32 the next groups of the ladder (``ladder()``:
    the groups most sensitive first and how many of them are float32 already), bisecting how many on the targets
    that missed (and ort:cpu when the recipe has it) until the tolerance holds there.  ``convert(nodes)``: the
    artifact with these further nodes float32; its last call is the artifact to write."""
    outcome = TargetsOutcome(checks)
    missed = checks.confirm(current, [])
    searched: set[str] = set()
    step = start = 0
    measured: tuple[list[list[str]], int] | None = None
    while [name for name in missed if name not in searched]:
        if measured is None:  # ranked only now: a budget whose emulation kept nothing measured no order
            measured = ladder()
            step = measured[1]
        groups, start = measured

        def kept(count: int, groups: list[list[str]] = groups, start: int = start) -> list[str]:
            return [node for group in groups[start:count] for node in group]

        searched |= {*missed, *({SEARCH_TARGET} & set(checks.evaluators))}
        names = sorted(searched)

        def holds(count: int, names: list[str] = names, kept: Callable[[int], list[str]] = kept) -> bool:
            return checks.holds_on(names, kept(count), lambda: convert(kept(count)))

        passed = step < len(groups) and holds(len(groups))
        found = bisect(holds, step, len(groups)) if passed else step  # else the artifact that held elsewhere
        outcome.phases.append(LadderPhase(", ".join(names), passed, found - start,
                                    None if passed else "the artifact that held before this search"))
        step = found
        missed = checks.confirm(convert(kept(step)), kept(step))
        if not passed:
            break
    outcome.float32_groups, outcome.missed = step - start, missed
    for name in missed:
        record = checks.records[name]
        if record.reason is None:
            record.reason = ("even with every node group float32 the tolerance misses on "
                             f"{name} (which ran {record.precision}): the error comes from what the budget does not "
                             "convert (casts, the float parts' numerics on that runtime)"
                             if outcome.phases and not outcome.phases[-1].met_there else "measured after the search")
    return outcome


def confirm_budget(conversion: Any, fixed: set[str]) -> None:
    """The fp16 stage's hook (``_Fp16Conversion``): its budget's artifact held on the recipe's targets; the outcome
    goes into ``conversion.budget.targets``, the nodes kept for a target into ``kept_in_fp32`` (reason "budget:
    missed on a target").  fp16 supplies the build (``convert``) and its candidate groups (``ladder``)."""
    budget: Fp16Budget = conversion.budget
    checks = target_checks(conversion.ctx.targets, conversion.feeds, conversion.float32.outputs,
                           conversion.tolerance, conversion.ctx.work_dir, conversion.ctx.on_progress,
                           judge=conversion.judge, detections=conversion.ctx.detections)
    base = list(conversion.kept)

    def convert(nodes: list[str]) -> onnx.ModelProto:
        conversion.kept = base + [{"node": name, "op_type": conversion._op_type(name),
                                   "reason": "budget: missed on a target"} for name in nodes]
        conversion.convert(fixed)
        return conversion.converted

    def ladder() -> tuple[list[list[str]], int]:
        if budget.choice.ladder:
            return budget.choice.ladder, budget.choice.chosen_count
        return rank_groups(conversion.model, budget.groups, conversion.needs.inputs, conversion.feeds,
                           conversion.float32.outputs, conversion.tolerance,
                           keep_io_types=conversion.config.keep_io_types, to_float16=conversion.to_float16,
                           work_dir=conversion.ctx.work_dir, judge=conversion.judge,
                           detections=conversion.ctx.detections), 0

    budget.targets = hold_on_targets(checks, conversion.converted, convert, ladder)
