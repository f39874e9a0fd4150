"""What to ship, per target: a pure function of the report's rows (validation, benchmarks, gates, failures); the
rows and records are parsed into their typed models (``qdeploy.core.rows``) first.

Rules (docs/verdict-and-throughput.md says them for users):
- targets are the recipe's, minus fidelity-only ones (reference:cpu); a target whose every validation row is
  ``unavailable`` is listed once under ``unavailable``, with the reason, and gets no verdict;
- a variant is a candidate on target T when it built, its validation on T passed, every evaluated gate on
  (variant, T) holds (size gates of the variant count on every target), and its benchmark on T at the ranked
  batch size is ``ok`` with a finite number;
- the ranking is by median latency (lower first), or by inferences per second when only throughput was
  measured; a target whose every timed candidate carries a decode record (a language model with a KV cache) is
  ranked by decode ms per token instead, its interval the noise rule (``verdict_decode``); the tie set is the
  best candidate plus every candidate the benchmark cannot tell from it (``qdeploy.core.ranking.apart_by``:
  a sign test over the paired interleaved rounds, or 95% intervals of the medians that do not overlap);
- the pick of the tie set follows ``report.tie_break``: 'fidelity' (the default) the reference first, then the
  closest to it (task metric, SNR, cosine), then the smaller, the simpler, the faster; 'size' the smallest
  artifact, sizes compared as printed (a difference below the printed precision is no difference), then the
  simpler (fewer stages), then the higher fidelity, then the better median; the ship line says which rule
  decided; the runner-up is the best other member of the tie set; every other variant is listed with its reason;
- with benchmarks off, the pick is the smallest artifact that passed, said to be unranked by speed;
- where the machine was busy while the target was timed (``machine_load`` of the rows) and the tie set holds more
  than one artifact, the verdict says it is undecided (``decided`` false, ``undecided`` the evidence) and ships the
  tie rule's pick meanwhile: a busy machine must not make the answer flip;
- the pick and the runner-up carry their ``execution`` (``qdeploy.pipeline.report.precision.execution_record``);
- a validation row that missed at the device's default precision and passed pinned (``deploy_precision``) is a
  candidate with that pinned setting, and the verdict says so.
A failed, errored or unavailable row is never a candidate, nor an artifact that every benchmark round measured
slower than the float reference on that target (its speedup range is below 1).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypedDict

from qdeploy.core.ranking import apart_by
from qdeploy.core.report import Report, as_report
from qdeploy.core.report_parts import ArtifactRecord, ExecutionRecord, VerdictSection
from qdeploy.core.rows import BenchmarkRow, BuildFailure, GateResult, ThroughputRow, ValidationRow
from qdeploy.core.runtimes import artifact_of, built_for, is_device_default, is_pinned_f32, setting_of
from qdeploy.core.values import is_finite_number
from qdeploy.pipeline.report.anchored import anchored_latency, anchored_throughput, relative_words
from qdeploy.pipeline.report.format import fmt_fidelity, fmt_mb, fmt_ms, fmt_number, fmt_rate, fmt_speedup
from qdeploy.pipeline.report.precision import execution_record
from qdeploy.pipeline.report.verdict_decode import (
    DECODE_WHY,
    decode_interval,
    decode_ms,
    decode_ratio,
    ranks_by_decode,
    slower_decode,
)

__all__ = ["FIDELITY_KEYS", "FIDELITY_ONLY", "TIE_BREAKS", "Choice", "ChoiceFigures", "ChoiceLatency",
           "ChoiceThroughput", "TargetFigures", "TargetVerdict", "compute_verdict", "indistinguishable", "ranking",
           "rejection", "split_targets", "target_verdict", "verdict_section"]

FIDELITY_ONLY = ("reference:cpu",)
TIE_BREAKS = ("fidelity", "size")
FIDELITY_KEYS = ("cosine", "snr_db", "max_abs_err", "top1_agreement", "kl", "task_metric", "detections_matched")


class ChoiceLatency(TypedDict, total=False):
    """A choice's latency figures: its benchmark row at the ranked batch size."""

    latency_ms: float | None
    ci95_ms: list[float] | None
    speedup: float | None
    speedup_range: list[float] | None
    noisy: bool | None
    speedup_vs_default: float | None
    speedup_vs_default_range: list[float] | None


class ChoiceThroughput(TypedDict, total=False):
    """A choice's throughput figures: its throughput row at the ranked batch size."""

    inferences_per_s: float | None
    requests_in_flight: int | None
    latency_at_load_ms: float | None
    throughput_speedup: float | None


class ChoiceFigures(ChoiceLatency, ChoiceThroughput, total=False):
    """``Choice.as_dict()``: a variant as the verdict section records it (``VerdictChoice``)."""

    variant: str | None
    fidelity: dict[str, float | None]
    size_bytes: int | None
    deploy_precision: str
    execution: ExecutionRecord


class TargetFigures(ChoiceFigures, total=False):
    """``TargetVerdict.as_dict()``: what to ship on one target (``TargetVerdictRecord``)."""

    status: str
    why: str
    decided: bool
    undecided: str | None
    runner_up: ChoiceFigures | None
    rejected: dict[str, str]


@dataclass
class Choice:
    """One variant on one target, as the verdict speaks of it.  ``score``: lower is better in either ranking."""

    variant: str
    score: float
    round_scores: list[float]
    interval: list[float] | None
    size_bytes: int | None
    fidelity: dict[str, float | None]
    latency: ChoiceLatency = field(default_factory=ChoiceLatency)
    throughput: ChoiceThroughput = field(default_factory=ChoiceThroughput)
    deploy_precision: str | None = None
    """The INFERENCE_PRECISION_HINT it ships with where the device default missed its tolerance."""
    execution: ExecutionRecord | None = None
    """What ran: ``precision.execution_record`` of its timed (else validation) row."""
    stages: int = 0
    """Stages of its lineage: of two artifacts the same size, the one with fewer is the simpler."""
    round_group: int | None = None
    """The session group its rounds came from (``BenchmarkRow.round_group``): rounds pair only within one."""
    sha256: str | None = None
    is_reference: bool = False
    task_lower_better: bool = False
    """Its task metric is lower-is-better (perplexity): fidelity ranks it negated."""
    machine: dict[str, Any] = field(default_factory=dict)
    """How busy the machine was while its target was timed (the benchmark row's ``machine_load``)."""
    decode_ms: float | None = None
    """Decode ms per token where its target ranks by decode (a language model with a KV cache)."""

    def as_dict(self) -> ChoiceFigures:
        pinned = {"deploy_precision": self.deploy_precision} if self.deploy_precision else {}
        ran = {"execution": self.execution} if self.execution is not None else {}
        decode = {"decode_ms_per_token": self.decode_ms} if self.decode_ms is not None else {}
        return {"variant": self.variant, **self.latency, **decode, **self.throughput, "fidelity": self.fidelity,
                "size_bytes": self.size_bytes, **pinned, **ran}


@dataclass
class TargetVerdict:
    target: str
    status: str = "none"
    """'ship' (a pick exists) or 'none' (nothing qualifies)."""
    pick: Choice | None = None
    runner_up: Choice | None = None
    why: str = ""
    rejected: dict[str, str] = field(default_factory=dict)
    undecided: str = ""
    """Why the benchmark could not decide (a busy machine left a tie): the pick is the tie rule's, meanwhile."""
    by: str = "latency"
    """What ranked this target: the section's ``by``, or 'decode' where every timed candidate has a decode record."""

    def as_dict(self) -> TargetFigures:
        return {"status": self.status, "variant": self.pick.variant if self.pick else None, "why": self.why,
                "decided": not self.undecided, "undecided": self.undecided or None,
                **({k: v for k, v in self.pick.as_dict().items() if k != "variant"} if self.pick else {}),
                "runner_up": self.runner_up.as_dict() if self.runner_up else None, "rejected": self.rejected}


@dataclass
class _Rows:
    """The report's rows on one target, keyed by variant."""

    checks: dict[str, ValidationRow]
    latency: dict[str, BenchmarkRow]
    throughput: dict[str, ThroughputRow]
    sizes: dict[str, int | None]
    failed_builds: dict[str, BuildFailure]
    gates: list[GateResult]
    reference: str | None = None
    timed: dict[str, BenchmarkRow | ThroughputRow] = field(default_factory=dict)
    """Per variant its timed row at the ranked batch (latency before throughput), for the execution record."""
    artifacts: dict[str, ArtifactRecord] = field(default_factory=dict)


def verdict_section(report: Report | Mapping[str, Any], tie_break: str | None = None) -> dict[str, Any]:
    """``compute_verdict`` as report.json holds it."""
    return compute_verdict(report, tie_break).to_json()


def compute_verdict(report: Report | Mapping[str, Any], tie_break: str | None = None) -> VerdictSection:
    """The report's ``verdict``: per available target what to ship, the targets this machine lacks, and the
    targets that cannot read the original model (``unreadable``: said once; nothing to ship there unless a variant
    reads there after all).  ``tie_break``: the recipe's ``report.tie_break`` (else the one a verdict already in
    the report used, else 'fidelity')."""
    report = as_report(report)
    rule = tie_break or (report.verdict.tie_break if report.verdict else None) or "fidelity"
    if rule not in TIE_BREAKS:
        rule = "fidelity"
    by, batch = ranking(report)
    targets, unavailable = split_targets(report)
    unreadable = {target: why for target, why in report.unreadable_targets.items() if target in targets}
    # a variant the target reads after all (simplify folded what the runtime could not) keeps its verdict there
    readable = {row.target for row in report.validation if not row.unreadable and row.status != "unavailable"}
    targets = [target for target in targets if target not in unreadable or target in readable]
    verdicts = {target: target_verdict(report, target, by, batch, rule) for target in targets}
    shipped = [verdict.by for verdict in verdicts.values() if verdict.status == "ship"]
    if by == "latency" and shipped and set(shipped) == {"decode"}:  # mixed: each target's why says which
        by = "decode"
    found = {target: verdict.as_dict() for target, verdict in verdicts.items()}
    return VerdictSection.model_validate({"by": by, "batch_size": batch, "tie_break": rule, "targets": found,
                                         "order": targets, "unavailable": unavailable, "unreadable": unreadable})


def ranking(report: Report | Mapping[str, Any]) -> tuple[str, int | None]:
    """What ranks the candidates ('latency', 'throughput', or 'size' when nothing was benchmarked) and at which
    batch size (the smallest measured).  A 'latency' target may still rank by decode (``target_verdict``)."""
    report = as_report(report)
    timed: tuple[tuple[str, list[BenchmarkRow] | list[ThroughputRow]], ...] = (
        ("latency", report.benchmarks), ("throughput", report.throughput))
    for by, rows in timed:
        batches = [row.batch_size for row in rows if row.status == "ok"]
        if batches:
            return by, min(batches)
    return "size", None


def split_targets(report: Report | Mapping[str, Any]) -> tuple[list[str], dict[str, str]]:
    """Targets with a verdict, and those whose every validation row is unavailable, with the reason."""
    targets: list[str] = []
    unavailable: dict[str, str] = {}
    validation = as_report(report).validation
    for target in dict.fromkeys(row.target for row in validation):
        if target in FIDELITY_ONLY:
            continue
        rows = [row for row in validation if row.target == target]
        if all(row.status == "unavailable" for row in rows):
            unavailable[target] = rows[0].reason or "not available on this machine"
        else:
            targets.append(target)
    return targets, unavailable


def target_verdict(report: Report | Mapping[str, Any], target: str, by: str, batch: int | None,
                   tie_break: str = "fidelity") -> TargetVerdict:
    rows = _rows(as_report(report), target, batch)
    if by == "latency" and ranks_by_decode(_timed_candidates(rows, target)):
        by = "decode"  # a language model with a KV cache: per-token decode, not prefill, is generation time
    verdict = TargetVerdict(target, by=by)
    candidates = []
    for variant in dict.fromkeys([*rows.sizes, *rows.checks, *rows.failed_builds]):
        if not built_for(variant, target):  # int8@ort on openvino:cpu: never a candidate there, nothing to say
            continue
        reason = rejection(variant, rows, by)
        if reason:
            verdict.rejected[variant] = reason
        else:
            candidates.append(_choice(variant, rows, by))
    if not candidates:
        verdict.why = "no artifact passed validation, its gates and a benchmark on this target"
        return verdict
    best = min(candidates, key=lambda c: c.score)
    ties = [c for c in candidates if c is best or indistinguishable(c, best)]
    files: dict[Any, Choice] = {}
    for choice in ties:  # two variants that wrote one file: the first in the recipe stands for both
        key = (choice.sha256, choice.size_bytes, setting_of(choice.variant))  # one file, another setting
        files.setdefault(key if choice.sha256 else id(choice), choice)
    tie_break = "size" if by == "size" else tie_break  # nothing timed: no tie to break, the smallest that passed
    pick = min(files.values(), key=_fidelity_key if tie_break == "fidelity" else _size_key)
    others = sorted((c for c in ties if c is not pick), key=lambda c: c.score)
    verdict.status, verdict.pick = "ship", pick
    verdict.runner_up = others[0] if others else None
    for choice in candidates:
        if choice in ties and choice is not pick and choice is not verdict.runner_up:
            verdict.rejected[choice.variant] = f"within the benchmark's noise of {best.variant}, but " \
                f"{pick.variant} is {_preference(pick, choice, tie_break)}; not the runner-up"
        elif choice not in ties:
            worse = {"throughput": "lower throughput", "decode": "slower decode"}.get(by, "slower")
            verdict.rejected[choice.variant] = f"{worse}: {_measure(choice, by)} against " \
                                               f"{_measure(best, by)} ({best.variant}), {_apart(choice, best)}"
    verdict.why = _why(pick, best, verdict.runner_up, by, tie_break)
    verdict.undecided = _undecided(ties, best)
    return verdict


def _timed_candidates(rows: _Rows, target: str) -> dict[str, BenchmarkRow]:
    """Per variant its ok latency row at the ranked batch, of the variants that built, passed validation and hold
    their gates on the target (the checks that come before timing: ``rejection`` by 'size')."""
    return {variant: bench for variant, bench in rows.latency.items()
            if built_for(variant, target) and bench.status == "ok" and is_finite_number(bench.p50)
            and not rejection(variant, rows, "size")}


def _undecided(ties: list[Choice], best: Choice) -> str:
    """The evidence that a busy machine left the benchmark unable to decide; '' when it decided (one artifact led,
    or the machine was quiet, where a tie is a tie and the rule decides)."""
    busy = [c.machine for c in ties if c.machine.get("busy")]
    if len(ties) < 2 or not busy:
        return ""
    load = busy[0]
    others = [c.variant for c in ties if c is not best]
    rounds = len(best.round_scores)
    return (f"machine busy: other processes used {float(load.get('other_cores') or 0):.2f} of {load.get('cores')} "
            f"cores while timing; after {rounds} rounds ({load.get('extra_rounds') or 0} extra) the rounds still "
            f"cannot tell {', '.join(others)} from {best.variant}")


def _rows(report: Report, target: str, batch: int | None) -> _Rows:
    latency = {row.variant: row for row in report.benchmarks if row.target == target and row.batch_size == batch}
    rates = {row.variant: row for row in report.throughput if row.target == target and row.batch_size == batch}
    gates = [gate for gate in report.gates if not gate.skipped
             and (gate.target == target or gate.metric == "size_bytes")]
    return _Rows(timed={**rates, **latency},  # latency rows win
                 artifacts={row.name: row for row in report.artifacts},
                 checks={row.variant: row for row in report.validation if row.target == target},
                 latency=latency, throughput=rates, sizes=report.sizes,
                 failed_builds={row.variant: row for row in report.failures}, gates=gates,
                 reference=report.reference.variant)


def rejection(variant: str, rows: _Rows, by: str) -> str:
    """Why a variant may not be shipped on the target; '' when it may."""
    if variant in rows.failed_builds:
        return f"failed to build in stage {rows.failed_builds[variant].stage}"
    check = rows.checks.get(variant)
    if check is None:
        return "not validated on this target"
    if check.status != "passed":
        return f"validation {check.status}: {check.reason or 'outside its tolerance'}"
    failed = [g for g in rows.gates if g.variant == variant and not g.passed]
    if failed:
        return "gate failed: " + "; ".join(f"{g.metric} {fmt_number(g.value)}" for g in failed)
    if by == "size":
        return ""
    bench = (rows.throughput if by == "throughput" else rows.latency).get(variant)
    if bench is None or bench.status != "ok":
        status = bench.status if bench else "missing"
        return f"benchmark {status}" + (f": {bench.reason}" if bench and bench.reason else "")
    if not is_finite_number(_score(bench, by)):
        return "its benchmark gave no finite number"
    if by == "decode" and isinstance(bench, BenchmarkRow):
        reference = rows.latency.get(rows.reference) if rows.reference else None
        return slower_decode(variant, bench, reference, rows.reference)
    return _slower_than_reference(variant, bench, rows.reference)


def _slower_than_reference(variant: str, bench: BenchmarkRow | ThroughputRow, reference: str | None) -> str:
    """A converted artifact that every round measured slower than the float reference on this target is never
    recommended there, whatever else it wins (size, a tie with a slower pick): quantizing to lose speed is not a
    deployment.  '' when it is not, or when the rounds cannot tell."""
    spread = bench.speedup_range
    if variant == reference or bench.speedup is None or not spread or max(spread) >= 1.0:
        return ""
    return (f"slower than the float reference {reference or ''} on this target: {fmt_speedup(bench.speedup, spread)}"
            " in every round; not recommended here").replace("  ", " ")


def _score(bench: BenchmarkRow | ThroughputRow, by: str) -> Any:
    if isinstance(bench, BenchmarkRow):
        return decode_ms(bench) if by == "decode" else bench.p50
    rate = bench.inferences_per_s
    return -rate if is_finite_number(rate) else None


def _choice(variant: str, rows: _Rows, by: str) -> Choice:
    metrics = rows.checks[variant].metrics
    fidelity = {key: metrics.value(key) for key in FIDELITY_KEYS if metrics.has(key)}
    check, artifact = rows.checks[variant], rows.artifacts.get(artifact_of(variant))
    choice = Choice(variant, 0.0, [], None, rows.sizes.get(artifact_of(variant)), fidelity,
                    deploy_precision=check.deploy_precision,
                    execution=execution_record(check.precision, rows.timed.get(variant), check),
                    stages=len((artifact.lineage or artifact.stages) if artifact else []),
                    sha256=artifact.sha256 if artifact else None, is_reference=variant == rows.reference,
                    task_lower_better=check.task_metric_direction == "lower")
    bench, rate = rows.latency.get(variant), rows.throughput.get(variant)
    if bench and bench.status == "ok":
        choice.latency = {"latency_ms": bench.p50, "ci95_ms": bench.latency_ms.ci95_p50 if bench.latency_ms else None,
                          "speedup": bench.speedup, "speedup_range": bench.speedup_range, "noisy": bench.noisy,
                          **({"speedup_vs_default": bench.speedup_vs_default,
                              "speedup_vs_default_range": bench.speedup_vs_default_range}
                             if bench.speedup_vs_default is not None else {})}
        choice.machine = dict(bench.machine_load or {})
        if by == "decode":  # the speedup shown is decode's, against the reference's decode on this target
            reference = rows.latency.get(rows.reference) if rows.reference else None
            ratio, spread = decode_ratio(bench, reference)  # prefill-only speedup_vs_default left out
            choice.latency = {"latency_ms": bench.p50, "ci95_ms": choice.latency.get("ci95_ms"), "speedup": ratio,
                              "speedup_range": spread, "noisy": bench.noisy}
    if rate and rate.status == "ok":
        choice.throughput = {"inferences_per_s": rate.inferences_per_s, "requests_in_flight": rate.requests_in_flight,
                             "latency_at_load_ms": rate.latency_ms.p50 if rate.latency_ms else None,
                             "throughput_speedup": rate.speedup}
    if by == "latency" and bench is not None:  # on a target timed in groups: over the anchor's rounds
        choice.score, choice.round_scores, choice.interval = anchored_latency(bench, rows.latency)
        choice.round_group = bench.round_group
    elif by == "decode" and bench is not None:
        choice.score = float(decode_ms(bench) or math.inf)
        choice.interval = decode_interval(bench)  # no per-round values: only the intervals tell apart
        choice.decode_ms = decode_ms(bench)
    elif by == "throughput" and rate is not None:
        choice.score, choice.round_scores, choice.interval = anchored_throughput(rate, rows.throughput)
        choice.round_group = rate.round_group
    return choice


def indistinguishable(candidate: Choice, best: Choice) -> bool:
    """The benchmark cannot say `best` is better (``qdeploy.core.ranking.apart_by``: neither a sign test over the
    paired rounds, a rank test where the two were timed in different groups, nor disjoint 95% intervals of the
    medians); without rounds or intervals, equal scores."""
    return not _apart(candidate, best)


def _apart(candidate: Choice, best: Choice) -> str:
    """Which test told `candidate` from `best`, in words ('behind in 19 of 21 paired rounds (sign test, ...)')."""
    if not (candidate.round_scores or candidate.interval):
        return "" if candidate.score == best.score else "one measurement each, no rounds to test"
    return apart_by(candidate.round_scores, best.round_scores, candidate.interval, best.interval,
                    paired=candidate.round_group == best.round_group)


def _size_key(choice: Choice) -> tuple[float, int, float, float]:
    """Among artifacts the benchmark cannot tell apart (``tie_break: size``): the smaller as printed, the simpler,
    the closer, the faster."""
    return _printed_mb(choice), choice.stages, -_fidelity_rank(choice), choice.score


def _fidelity_key(choice: Choice) -> tuple[bool, float, float, int, float]:
    """Among artifacts the benchmark cannot tell apart (``tie_break: fidelity``): the reference, the closer, the
    smaller as printed, the simpler, the faster."""
    return not choice.is_reference, -_fidelity_rank(choice), _printed_mb(choice), choice.stages, choice.score


def _printed_mb(choice: Choice) -> float:
    """The size as the report prints it: two sizes that print alike are the same size to the reader."""
    return float(fmt_number(choice.size_bytes / 1e6)) if is_finite_number(choice.size_bytes) else math.inf


def _preference(pick: Choice, other: Choice, tie_break: str = "size") -> str:
    """Why `pick` goes before `other`, both within the benchmark's noise: 'smaller (0.500 MB against 2.00 MB)'."""
    if pick.sha256 and (pick.sha256, pick.size_bytes, setting_of(pick.variant)) == (
            other.sha256, other.size_bytes, setting_of(other.variant)):
        return f"the same file as {other.variant} (same sha256), first in the recipe"
    if tie_break == "fidelity":
        return _closer(pick, other)
    if _printed_mb(pick) != _printed_mb(other):
        return f"smaller ({fmt_mb(pick.size_bytes)} against {fmt_mb(other.size_bytes)})"
    size = f"the same size to the printed precision ({fmt_mb(pick.size_bytes)})"
    if pick.stages != other.stages:
        return f"{size} and simpler ({pick.stages} stages against {other.stages})"
    if _fidelity_rank(pick) != _fidelity_rank(other):
        return f"{size}, as simple ({pick.stages} stages) and closer to the reference"
    return f"{size}, as simple and as close to the reference, and its median is lower"


def _closer(pick: Choice, other: Choice) -> str:
    """Why ``pick`` wins a tie on fidelity: 'the reference (ties go to fidelity)', 'closer to the reference ...'."""
    if pick.is_reference:
        return "the reference itself (ties go to fidelity: report.tie_break)"
    if _fidelity_rank(pick) != _fidelity_rank(other):
        return (f"closer to the reference ({fmt_fidelity(pick.fidelity)} against {fmt_fidelity(other.fidelity)}; "
                "ties go to fidelity: report.tie_break)")
    return f"as close to the reference and then {_preference(pick, other, 'size')}"


def _fidelity_rank(choice: Choice) -> float:
    for key in ("task_metric", "detections_matched", "snr_db", "cosine"):
        value = choice.fidelity.get(key)
        if is_finite_number(value):
            lower = key == "task_metric" and choice.task_lower_better  # a lower perplexity is closer
            return -float(value) if lower else float(value)
    return -math.inf


def _measure(choice: Choice, by: str) -> str:
    if by == "throughput":
        rate = choice.throughput.get("inferences_per_s")
        return fmt_rate(rate) + relative_words(choice.score, rate, by)
    if by == "decode":
        return f"{fmt_ms(choice.decode_ms)} per token decode"
    return fmt_ms(choice.latency.get("latency_ms")) + relative_words(choice.score, choice.latency.get("latency_ms"), by)


def _why(pick: Choice, best: Choice, runner_up: Choice | None, by: str, tie_break: str = "size") -> str:
    if by == "size":
        return "benchmarks are off: the smallest artifact that passed; not ranked by speed"
    why = _why_timed(pick, best, runner_up, by, tie_break)
    return f"{why}; {DECODE_WHY}" if by == "decode" else why  # says why prefill ms did not rank it


def _why_timed(pick: Choice, best: Choice, runner_up: Choice | None, by: str, tie_break: str) -> str:
    word = "highest-throughput" if by == "throughput" else "fastest"
    plain = "the float32 model as the device runs it by default, no quantization needed: "
    if is_device_default(pick.variant):
        word = f"{plain}the {word}"
    elif is_pinned_f32(pick.variant):
        word = f"{artifact_of(pick.variant)} pinned to f32 (its activations in float32): the {word}"
    if runner_up is None:
        return f"{word} artifact that passed ({_measure(pick, by)}" + (
            f", {fmt_speedup(pick.latency.get('speedup'), pick.latency.get('speedup_range'))} the reference)"
            if by in ("latency", "decode") and pick.latency.get("speedup") is not None else ")")
    if pick is best:
        return (f"{word} artifact that passed ({_measure(pick, by)}); {runner_up.variant} is within the "
                f"benchmark's noise ({_measure(runner_up, by)}), and {pick.variant} is "
                f"{_preference(pick, runner_up, tie_break)}")
    return (f"{plain if is_device_default(pick.variant) else ''}ties with {best.variant} within the benchmark's "
            f"noise ({_measure(pick, by)} against {_measure(best, by)}) and is {_preference(pick, best, tie_break)}")
