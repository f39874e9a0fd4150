"""The fp16 budget's artifact confirmed on every target of the recipe, as validation will run it there.

Budget mode searches on an emulation of float16 (one gated ONNX Runtime model, ``_budget``).  The converted
artifact is then run on each target of the recipe through that target's adapter at the precision validation
runs an fp16 artifact (the device's default: bfloat16 float parts on an OpenVINO CPU with AVX512-BF16; ONNX
Runtime's CPU casts around the ops it has no float16 kernel for), on the budget's samples, against float32 with
the real tolerance.  Where validation also checks fp16 artifacts on reference:cpu (true float16 arithmetic, when
the recipe has no GPU: ``qdeploy.targets.true_fp16_check``), that check is one of the targets, on its first
``REFERENCE_SAMPLES`` samples.  Each target ends ``confirmed``, ``missed`` (with its metrics) or ``unavailable`` (the
reason; never a CPU standing in for a GPU).  When a target misses, the groups the emulation ranked next are kept
float32 too, by bisection measured on that target (and on ort:cpu when the recipe has it, so a kept set still
holds where it held), until the tolerance holds there or every group is float32 and it still misses: then the
artifact closest to the tolerance is written and the target stays ``missed``, with the reason.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from qdeploy.core.compare import OutputComparison
from qdeploy.core.errors import TargetUnavailable
from qdeploy.graph.external_data import save_onnx
from qdeploy.stages.fp16._budget import rank_groups
from qdeploy.stages.task_metric import MetricComparison, TaskJudge, judged, metric_summary
from qdeploy.targets import TRUE_FP16_TARGET, availability_of, load_as_deployed
from qdeploy.targets.base import TargetFellBack, short_message
from qdeploy.targets.cpu_facts import pins_after, short_precision

if TYPE_CHECKING:
    import numpy as np
    import onnx

    from qdeploy.core.tolerance import Tolerance
    from qdeploy.targets.base import Session

log = logging.getLogger(__name__)

CONFIRMED, MISSED, UNAVAILABLE = "confirmed", "missed", "unavailable"
REFERENCE_SAMPLES = 2
"""Samples run on reference:cpu (true float16, onnx's evaluator: seconds per sample), as validation's
``fp16_reference_samples`` default."""
SEARCH_TARGET = "ort:cpu"
Outputs = list[dict[str, "np.ndarray"]]


def load_as_validated(target: str, path: Path, hint: str | None = None) -> Session:
    """The artifact loaded on ``target`` as validation loads an fp16 one (``qdeploy.targets.load_as_deployed``)."""
    return load_as_deployed(target, path, hint)


@dataclass
class TargetRuns:
    """The recipe's targets: runs of candidate artifacts on each, their verdicts, and what each cost."""

    targets: Sequence[str]
    feeds: list[dict[str, np.ndarray]]
    reference: Outputs
    tolerance: Tolerance
    work_dir: Path
    on_progress: Callable[[str], None] = lambda message: None
    load: Callable[[str, Path], Session] | None = None
    """How a target loads the artifact; None: ``load_as_validated``."""
    judge: TaskJudge | None = None
    """Decides by the task metric's drop instead of ``tolerance`` (``tolerance: {metric, max_drop}``)."""
    records: dict[str, dict[str, Any]] = field(default_factory=dict)
    cost: dict[str, dict[str, Any]] = field(default_factory=dict)
    known: dict[tuple[str, int], OutputComparison] = field(default_factory=dict)
    available: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        for name in self.targets:
            ok, reason = availability_of(name)
            if ok:
                self.available.append(name)
                self.cost[name] = {"evaluations": 0, "seconds": 0.0}
            else:
                self.records[name] = {"status": UNAVAILABLE, "reason": reason}

    def compare(self, name: str, step: int, model: onnx.ModelProto) -> OutputComparison:
        """The artifact of ladder step ``step`` on target ``name`` against float32 (measured once)."""
        if (name, step) not in self.known:
            self.on_progress(f"fp16 budget: running the artifact on {name}")
            self.known[(name, step)] = self._run(name, model)
        return self.known[(name, step)]

    def _run(self, name: str, model: onnx.ModelProto, hint: str | None = None) -> OutputComparison:
        started = time.perf_counter()
        path = self.work_dir / "fp16_budget_target.onnx"
        save_onnx(model, path)
        load = self.load or load_as_validated
        try:
            with (load(name, path, hint) if hint else load(name, path)) as session:
                self.records.setdefault(name, {})["pinned" if hint else "precision"] = session.executed.precision
                count = REFERENCE_SAMPLES if name == TRUE_FP16_TARGET else len(self.feeds)
                outputs = [session.run(feed) for feed in self.feeds[:count]]
            comparison = judged(self.reference[:count], outputs, self.tolerance, self.judge)
        except Exception as exc:  # a runtime refusing or failing the artifact is that target's measured failure
            comparison = OutputComparison([], False, [f"{name} cannot run the artifact: {short_message(exc)}"])
            if isinstance(exc, TargetUnavailable) and not isinstance(exc, TargetFellBack):
                comparison.notes.append(UNAVAILABLE)  # the target's own limit (onnx.reference): no verdict
        self.cost[name]["evaluations"] += 1
        self.cost[name]["seconds"] = round(self.cost[name]["seconds"] + time.perf_counter() - started, 3)
        return comparison

    def confirm(self, step: int, model: onnx.ModelProto) -> list[str]:
        """Every available target's verdict on the artifact of ``step``; the targets it misses."""
        missed = []
        for name in self.available:
            comparison = self.compare(name, step, model)
            if UNAVAILABLE in comparison.notes:
                self.records[name] = {"status": UNAVAILABLE, "reason": comparison.reasons[0]}
                continue
            record = self._record(comparison, self.records.get(name, {}).get("precision"))
            if not comparison.passed:
                record = self._pinned(name, model, record)
            self.records[name] = record
            if record["status"] == MISSED:
                missed.append(name)
        return missed

    @staticmethod
    def _record(comparison: OutputComparison, precision: str | None) -> dict[str, Any]:
        worst = comparison.worst()
        task = metric_summary(comparison) if isinstance(comparison, MetricComparison) else None
        return {"status": CONFIRMED if comparison.passed else MISSED, "precision": precision,
                **{key: worst.get(key) for key in ("cosine", "snr_db", "max_abs_err")},
                **({key: task[key] for key in ("metric", "reference_metric", "drop", "allowed_drop")} if task else {}),
                "reasons": comparison.reasons[:3]}

    def _pinned(self, name: str, model: onnx.ModelProto, missed: dict[str, Any]) -> dict[str, Any]:
        """A target that missed at its default precision (below float32), tried pinned as validation will try it:
        the first pinned INFERENCE_PRECISION_HINT that holds is confirmed as the setting to ship, the default's
        miss kept beside it; else the default's record, with what each pin gave."""
        tried = []
        for hint in pins_after(name, missed["precision"]):
            self.on_progress(f"fp16 budget: {name} missed at its default precision; trying {hint} pinned")
            comparison = self._run(name, model, hint)
            ran = self.records.get(name, {}).get("pinned")
            if comparison.passed and short_precision(ran) == hint:
                return {**self._record(comparison, ran), "deploy_precision": hint, "default": missed,
                        "note": f"misses at the device default ({missed['precision']}); holds with "
                                f"INFERENCE_PRECISION_HINT {hint} pinned, the setting validation ships"}
            tried.append(f"{hint}: {'passed' if comparison.passed else 'missed'} (ran {ran})")
        return {**missed, "pinned": tried} if tried else missed


def hold_on_targets(runs: TargetRuns, current: onnx.ModelProto, convert: Callable[[list[str]], onnx.ModelProto],
                    ladder: Callable[[], tuple[list[list[str]], int]]) -> dict[str, Any]:
    """Confirm ``current`` on every target; on a miss, keep float32 the next groups of the ladder (``ladder()``:
    the groups most sensitive first and how many of them are float32 already), bisecting how many on the targets
    that missed (and ort:cpu when the recipe has it) until the tolerance holds there.  ``convert(nodes)``: the
    artifact with these further nodes float32; its last call is the artifact to write.  Returns the findings."""
    missed = runs.confirm(0, current)
    phases: list[dict[str, Any]] = []
    searched: set[str] = set()
    step = start = 0
    measured: tuple[list[list[str]], int] | None = None
    while [name for name in missed if name not in searched]:
        if measured is None:  # ranked only now: a budget whose emulation kept nothing measured no order
            measured = ladder()
            step = measured[1]
        groups, start = measured

        def build(k: int, groups: list[list[str]] = groups, start: int = start) -> onnx.ModelProto:
            return convert([node for group in groups[start:k] for node in group])

        if start:  # the artifact confirmed as step 0 is the ladder's step ``start``
            runs.known.update({(name, start): runs.known.pop((name, 0)) for name in runs.available
                               if (name, 0) in runs.known})
        searched |= {*missed, *({SEARCH_TARGET} & set(runs.available))}
        found, passed = _bisect(runs, sorted(searched), build, step, len(groups))
        if not passed:  # no further float32 group holds there: the artifact that held elsewhere is written
            found = step
        phases.append({"searched_on": ", ".join(sorted(searched)), "met_there": passed,
                       "float32_groups": found - start,
                       **({} if passed else {"written": "the artifact that held before this search"})})
        step = found
        missed = runs.confirm(step, build(step))
        if not passed:
            break
    findings: dict[str, Any] = {"phases": phases, "target_float32_groups": step - start}
    if missed:
        for name in missed:
            runs.records[name].setdefault("reason", "even with every node group float32 the tolerance misses on "
                                          f"{name} (which ran {runs.records[name].get('precision')}): the error "
                                          "comes from what the budget does not convert (casts, the float parts' "
                                          "numerics on that runtime)" if phases and not phases[-1]["met_there"]
                                          else "measured after the search")
        findings["note"] = (f"budget not met on {', '.join(missed)}; "
                            f"{phases[-1].get('written', 'the measured artifact') if phases else 'the artifact'} "
                            "is written and marked as failing there")
    findings.update(targets=dict(runs.records), runtimes=runs.cost)
    return findings


def _bisect(runs: TargetRuns, names: list[str], build: Callable[[int], onnx.ModelProto], failing: int,
            steps: int) -> tuple[int, bool]:
    """The fewest ladder steps above ``failing`` holding on every target in ``names``: (steps, True); (failing,
    False) when even all of them miss."""
    def holds(step: int) -> bool:
        model = None
        for name in names:
            if (name, step) not in runs.known:
                model = build(step) if model is None else model
                runs.compare(name, step, model)
        return all(runs.known[(name, step)].passed for name in names)

    passing = steps
    if failing >= steps or not holds(steps):
        return failing, False
    while passing - failing > 1:
        middle = (failing + passing) // 2
        if holds(middle):
            passing = middle
        else:
            failing = middle
    return passing, True


def confirm_budget(conversion: Any, fixed: set[str]) -> None:
    """The fp16 stage's hook (``_Fp16Conversion``): its budget's artifact held on the recipe's targets; the findings go
    into ``budget``, the nodes kept for a target into ``kept_in_fp32`` (reason "budget: missed on a target")."""
    result = conversion.budget_result
    runs = TargetRuns(conversion.ctx.targets, conversion.feeds, conversion.float32.outputs, conversion.tolerance,
                      conversion.ctx.work_dir, conversion.ctx.on_progress, judge=conversion.judge)
    base = list(conversion.kept)

    def convert(nodes: list[str]) -> onnx.ModelProto:
        conversion.kept = base + [{"node": name, "op_type": conversion._op_type(name),
                                "reason": "budget: missed on a target"} for name in nodes]
        conversion.convert(fixed)
        return conversion.converted

    def ladder() -> tuple[list[list[str]], int]:
        if result.ladder:
            return result.ladder, result.chosen
        return rank_groups(conversion.model, conversion.budget_groups, conversion.needs.inputs, conversion.feeds,
                           conversion.float32.outputs, conversion.tolerance,
                           keep_io_types=conversion.config.keep_io_types, to_float16=conversion.to_float16,
                           work_dir=conversion.ctx.work_dir, judge=conversion.judge), 0

    budget = conversion.budget
    found = hold_on_targets(runs, conversion.converted, convert, ladder)
    emulated = budget.get("met")
    budget.update(found, met_emulated=emulated, met=bool(emulated) and not found.get("note"))
    budget["runtimes"] = {"emulation (ort:cpu, gated float16 twin)": {"evaluations": budget.get("trials"),
                                                                      "seconds": budget.get("seconds")},
                          **budget["runtimes"]}
