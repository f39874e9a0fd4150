"""Where the accuracy budget's promise is checked: on every target the variant will be validated on.

The search ranks and searches where an evaluation is cheap (ONNX Runtime's CPU provider; fp16: its emulation).
What it finds is
then run on each target of the recipe that validation will run the variant on (a ``per_runtime`` build
``v@openvino`` only on OpenVINO's), through that target's own adapter at the precision validation runs it
(``load_as_validated``), on the held-back and search samples with the real tolerance.  Each target ends
``confirmed``, ``missed`` (with its metrics) or ``unavailable`` (with the reason: a GPU this machine lacks is
never stood in for by the CPU).  A target that misses joins the search (``Combined``): the search goes on with
its measurements, and those of the targets already confirmed, until the tolerance holds on all of them or it
says it cannot.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from qdeploy.core.compare import OutputComparison
from qdeploy.core.errors import TargetUnavailable
from qdeploy.core.runtimes import runtime_of_target
from qdeploy.core.values import finite_or
from qdeploy.stages.accuracy_budget.evaluate import (
    CannotRun,
    Evaluator,
    Feeds,
    Measured,
    Outputs,
    Runner,
    error_ratio,
    ort_runner,
    summary,
)
from qdeploy.stages.accuracy_budget.findings import RuntimeCost, TargetRecord
from qdeploy.stages.accuracy_budget.precision import pinned_fallback
from qdeploy.targets import availability_of, load_as_deployed
from qdeploy.targets.base import TargetFellBack, short_message

if TYPE_CHECKING:
    import onnx

    from qdeploy.targets.base import Session

__all__ = ["CONFIRMED", "MISSED", "SEARCH_TARGET", "UNAVAILABLE", "Combined", "CombinedMeasured", "TargetChecks",
           "TargetPlan", "TargetRunner", "load_as_validated", "plan_targets"]

log = logging.getLogger(__name__)

SEARCH_TARGET = "ort:cpu"
"""The target whose runtime the search itself runs: its confirmation reuses the search's measurements."""
CONFIRMED, MISSED, UNAVAILABLE = "confirmed", "missed", "unavailable"


def load_as_validated(target: str, path: Path, hint: str | None = None) -> Session:
    """The candidate loaded on ``target`` as validation loads an int8 or fp16 artifact
    (``qdeploy.targets.load_as_deployed``), as a trial: the published artifact's validation reports the session."""
    return load_as_deployed(target, path, hint, trial=True)


class TargetRunner:
    """Runs candidates on one target through its adapter; remembers the precision that really ran."""

    def __init__(self, target: str, load: Callable[[str, Path], Session] | None = None,
                 hint: str | None = None) -> None:
        self.target = target
        self.load = load
        """How the target loads a candidate; None: this module's ``load_as_validated``, looked up at each load."""
        self.hint = hint
        """A pinned INFERENCE_PRECISION_HINT; None: the device's default."""
        self.precision: str | None = None

    def pinned(self, hint: str) -> TargetRunner:
        """The same target with its inference precision pinned to ``hint``."""
        return TargetRunner(self.target, self.load, hint)

    def __call__(self, path: Path, batches: list[list[Feeds]]) -> list[Outputs]:
        load = self.load or load_as_validated
        try:
            with (load(self.target, path, self.hint) if self.hint else load(self.target, path)) as session:
                self.precision = session.executed.precision
                return [[session.run(feed) for feed in feeds] for feeds in batches]
        except Exception as exc:  # a runtime refusing or failing a graph is that target's measured failure
            limit = isinstance(exc, TargetUnavailable) and not isinstance(exc, TargetFellBack)
            raise CannotRun(f"{self.target} cannot run the candidate: {short_message(exc)}",
                            unavailable=limit) from None


@dataclass
class TargetPlan:
    """One target the variant is validated on: how to run candidates there, or why it cannot be."""

    name: str
    runner: Runner | None
    """None: unavailable here (``reason``)."""
    reason: str = ""
    samples: int | None = None
    """Search samples run there (None: all): a slow target (reference:cpu) confirms on its first few."""

    @property
    def search(self) -> bool:
        """Whether the search's own runtime is this target's."""
        return self.name == SEARCH_TARGET and self.runner is ort_runner


def plan_targets(targets: Sequence[str], runtime: str | None, *, search_session: bool = True,
                 samples: dict[str, int] | None = None) -> list[TargetPlan]:
    """The recipe's targets that validation runs a variant built for ``runtime`` on (every target when None),
    each with a runner or the reason it has none.  By the config's runtime, not the variant's name: the artifact
    is cached by its config, and a build for every runtime is confirmed on every target.  ``search_session``:
    ort:cpu is confirmed with the search's own session (else through its adapter); ``samples``: the search
    samples a target runs, where not all."""
    plans = []
    for name in targets:
        if runtime is not None and runtime_of_target(name) != runtime:
            continue
        if name == SEARCH_TARGET and search_session:
            plans.append(TargetPlan(name, ort_runner))
            continue
        available, reason = availability_of(name)
        plans.append(TargetPlan(name, TargetRunner(name) if available else None, reason,
                                (samples or {}).get(name)))
    return plans


@dataclass
class CombinedMeasured:
    """A candidate measured on several runtimes."""

    parts: dict[str, Measured]

    @property
    def held_part(self) -> bool:
        return all(part.held_part for part in self.parts.values())


class Combined:
    """The search's evaluator over several runtimes: a candidate passes when it passes on every one; the
    comparison it reports is the worst one's."""

    def __init__(self, evaluators: dict[str, Evaluator]) -> None:
        self.evaluators = evaluators
        first = next(iter(evaluators.values()))
        self.tolerance = first.tolerance
        self.search_feeds = first.search_feeds
        self.label = ", ".join(evaluators)

    def measure(self, model: onnx.ModelProto, *, held: bool = False, samples: int | None = None) -> CombinedMeasured:
        return CombinedMeasured({name: evaluator.measure(model, held=held, samples=samples)
                                 for name, evaluator in self.evaluators.items()})

    def on_search(self, measured: CombinedMeasured, fraction: float = 1.0) -> OutputComparison:
        return self._worst([e.on_search(measured.parts[n], fraction) for n, e in self.evaluators.items()])

    def on_held(self, measured: CombinedMeasured) -> OutputComparison:
        return self._worst([e.on_held(measured.parts[n]) for n, e in self.evaluators.items()])

    def per_sample_ratios(self, measured: CombinedMeasured) -> list[float]:
        per_runtime = [e.per_sample_ratios(measured.parts[n]) for n, e in self.evaluators.items()]
        return [max(values) for values in zip(*per_runtime, strict=True)]

    def _worst(self, comparisons: list[OutputComparison]) -> OutputComparison:
        return max(comparisons, key=lambda c: (not c.passed, finite_or(error_ratio(c, self.tolerance), 1e9)))


@dataclass
class TargetChecks:
    """The variant's targets: their evaluators, their latest verdicts, and what each runtime cost."""

    search: Evaluator
    plans: Sequence[TargetPlan]
    on_progress: Callable[[str], None] = lambda message: None
    evaluators: dict[str, Evaluator] = field(default_factory=dict)
    records: dict[str, TargetRecord] = field(default_factory=dict)
    known: dict[tuple[str, frozenset[str]], Measured] = field(default_factory=dict)
    roles: dict[str, set[str]] = field(default_factory=dict)
    pin_cost: dict[str, int] = field(default_factory=dict)
    """Evaluations per target spent on pinned precisions after a miss at the default."""
    pin_seconds: dict[str, float] = field(default_factory=dict)
    searched_here: bool = True
    """Whether ``search`` ranked and searched (its cost is reported); False: it only lends its samples and
    reference to the targets' evaluators (fp16 searches on its emulation)."""
    samples: dict[str, int | None] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.searched_here:
            self.roles[self.search.label] = {"ranking", "search"}
        for plan in self.plans:
            if plan.runner is None:
                self.records[plan.name] = TargetRecord(status=UNAVAILABLE, reason=plan.reason)
                continue
            self.evaluators[plan.name] = self.search if plan.search else self.search.on_runtime(plan.runner,
                                                                                                 plan.name)
            self.samples[plan.name] = plan.samples
            self.roles.setdefault(plan.name, set()).add("confirmation")

    def remember(self, kept: list[str], measured: Measured | CombinedMeasured, evaluator: Evaluator | Combined) -> None:
        """Keep a search's measurement of ``kept`` (with held-back samples) for the confirmation to reuse."""
        if not measured.held_part:
            return
        parts = measured.parts if isinstance(measured, CombinedMeasured) else {evaluator.label: measured}
        for name, part in parts.items():
            self.known[(name, frozenset(kept))] = part

    def measured(self, name: str, model: onnx.ModelProto, kept: list[str]) -> Measured:
        key = (name, frozenset(kept))
        if key not in self.known:
            self.on_progress(f"accuracy budget: confirming on {name}, {len(kept)} node(s) kept float")
            self.known[key] = self.evaluators[name].measure(model, held=True, samples=self.samples.get(name))
        return self.known[key]

    def holds_on(self, names: Sequence[str], kept: list[str], build: Callable[[], onnx.ModelProto]) -> bool:
        """Whether the model with ``kept`` holds the real tolerance on every target in ``names`` (each measured
        once; ``build`` is called only when one was not measured yet)."""
        model: onnx.ModelProto | None = None
        for name in names:
            if (name, frozenset(kept)) not in self.known:
                model = build() if model is None else model
                self.measured(name, model, kept)
        return all(self._record(self.evaluators[name], self.known[(name, frozenset(kept))]).status == CONFIRMED
                   for name in names)

    def confirm(self, model: onnx.ModelProto, kept: list[str]) -> list[str]:
        """Measure the model on every available target with the real tolerance; the targets it misses."""
        missed = []
        for name, evaluator in self.evaluators.items():
            measured = self.measured(name, model, kept)
            if measured.unavailable:  # the target's own limit (as validation reports it): no verdict
                self.records[name] = TargetRecord(status=UNAVAILABLE, reason=measured.failure)
                continue
            record = self._record(evaluator, measured)
            if record.status == MISSED:
                record = self._pinned(name, evaluator, model, record)
            self.records[name] = record
            if record.status == MISSED:
                missed.append(name)
        return missed

    def _record(self, evaluator: Evaluator, measured: Measured) -> TargetRecord:
        """A target's verdict on one measurement, on the search and the held-back samples."""
        search = evaluator.on_search(measured)
        held = evaluator.on_held(measured) if measured.held_part else None
        passed = search.passed and (held is None or held.passed)
        record = TargetRecord(status=CONFIRMED if passed else MISSED, search=summary(search, evaluator.tolerance))
        if held is not None:
            record.held_back = summary(held, evaluator.tolerance)
        runner = evaluator.runner
        if isinstance(runner, TargetRunner):
            record.precision = runner.precision  # set even when None: the report says it did not say
        elif evaluator is self.search:
            record.measured_by = "the search's ONNX Runtime CPU session (as ort:cpu runs the artifact)"
        if measured.failure:
            record.reason = measured.failure
        return record

    def _pinned(self, name: str, evaluator: Evaluator, model: onnx.ModelProto,
                missed: TargetRecord) -> TargetRecord:
        """A target that missed at its default precision (below float32), tried pinned as validation will try it
        (``precision.pinned_fallback``): the pinned INFERENCE_PRECISION_HINT that holds is confirmed as the setting
        to ship, with the default's miss kept beside it; else the default's record, with what each pin gave."""
        runner = evaluator.runner
        if not isinstance(runner, TargetRunner) or runner.hint is not None:
            return missed

        def attempt(hint: str) -> tuple[bool, str | None, TargetRecord]:
            pinned = self.search.on_runtime(runner.pinned(hint), f"{name} pinned {hint}")
            self.on_progress(f"accuracy budget: {name} missed at its default precision; trying {hint} pinned")
            record = self._record(pinned, pinned.measure(model, held=True, samples=self.samples.get(name)))
            self.pin_cost[name] = self.pin_cost.get(name, 0) + 1
            self.pin_seconds[name] = self.pin_seconds.get(name, 0.0) + pinned.seconds
            return record.status == CONFIRMED, record.precision, record

        fallback = pinned_fallback(name, runner.precision, attempt)
        if fallback.held is not None:
            return fallback.held.result.model_copy(update={
                "deploy_precision": fallback.held.hint, "default": missed,
                "note": f"misses at the device default ({missed.precision}); holds with "
                        f"INFERENCE_PRECISION_HINT {fallback.held.hint} pinned, the setting validation ships"})
        tried = [f"{pin.hint}: {pin.result.status}{_worst_of(pin.result)}" for pin in fallback.attempts]
        return missed.model_copy(update={"pinned": tried}) if tried else missed

    def search_set(self, names: Sequence[str]) -> Combined:
        """The search's evaluator over ``names`` (missed targets) and ort:cpu when the variant is validated there:
        a kept set must still hold where it held."""
        chosen = sorted({*names, *([SEARCH_TARGET] if SEARCH_TARGET in self.evaluators else [])})
        for name in chosen:
            self.roles.setdefault(name, set()).add("search after a miss")
        return Combined({name: self.evaluators[name] for name in chosen})

    def verdicts(self) -> dict[str, TargetRecord]:
        """Each target's record, in the recipe's order."""
        return {plan.name: self.records[plan.name] for plan in self.plans if plan.name in self.records}

    def cost(self) -> dict[str, RuntimeCost]:
        """Evaluations and seconds per runtime (the search's ONNX Runtime session counts its ranking runs)."""
        runtimes = {**({self.search.label: self.search} if self.searched_here else {}), **self.evaluators}
        return {name: RuntimeCost(evaluations=evaluator.count + self.pin_cost.get(name, 0),
                                  seconds=round(evaluator.seconds + self.pin_seconds.get(name, 0.0), 3),
                                  used_for=sorted(self.roles.get(name, set())
                                                  | ({"pinned precision"} if name in self.pin_cost else set())))
                for name, evaluator in runtimes.items()}

    def all_confirmed(self) -> bool | None:
        """True when every available target confirmed; None when none is available here."""
        checked = [record for record in self.records.values() if record.status != UNAVAILABLE]
        return all(record.status == CONFIRMED for record in checked) if checked else None

    def sentence(self) -> str:
        """One line per target: its verdict, for the ``confirmed`` finding."""
        if not self.plans:
            return "no target of the recipe is known to this stage: checked on the search's ONNX Runtime only"
        return "; ".join(f"{name}: {record.status}" + _worst_of(record) for name, record in self.verdicts().items())


def _worst_of(record: TargetRecord) -> str:
    if record.status == UNAVAILABLE:
        return f" ({record.reason})"
    parts = [part for part in (record.search, record.held_back) if part is not None]
    drops = [part["drop"] for part in parts if part.get("drop") is not None]
    if drops:  # a task metric's budget
        ran = f", ran {record.precision}" if record.precision else ""
        return f" (task metric drop {max(drops):.4g}{ran})"
    cosines = [part["cosine"] for part in parts if part.get("cosine") is not None]
    snrs = [part["snr_db"] for part in parts if part.get("snr_db") is not None]
    matched = [part["detections_matched"] for part in parts if part.get("detections_matched") is not None]
    if matched and not cosines:  # a detector's boxes, matched by IoU
        return f" (detections matched {min(matched):.1%}{f', ran {record.precision}' if record.precision else ''})"
    if not cosines:
        return f" ({record.reason if 'reason' in record.model_fields_set else 'no metrics'})"
    snr = f", SNR {min(snrs):.3g} dB" if snrs else ""
    ran = f", ran {record.precision}" if record.precision else ""
    return f" (worst cosine {min(cosines):.6g}{snr}{ran})"
