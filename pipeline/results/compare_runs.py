"""What changed between two runs: latency ratios, metric changes, gates and statuses that flipped.

Pure functions over two typed reports (``qdeploy.core.report.Report``; ``compare_reports``), so CI jobs that
prepare deployments release after release can fail on a regression (``RunComparison.regressions``).  Rows are
matched by variant, target and batch size; rows present in one run only are listed, never guessed at.

A comparison is only as good as its likeness: two runs of different models (their inputs or outputs differ),
or with no row in common, are refused (``NotComparableError``, exit 2) unless the caller allows it; every
other difference of model, recipe or environment is named in ``RunComparison.warnings``.  A value that run A
measured and run B did not (missing, errored, NaN) is a regression whatever the thresholds.  A latency change
within the noise either run measured for that row (its 95% interval, the spread of its rounds) is never one.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from qdeploy.core.errors import QdeployInputError
from qdeploy.core.layer_rows import check_layers_section
from qdeploy.core.report import Report, as_report
from qdeploy.core.rows import BenchmarkRow, BuildFailure, GateResult, ValidationRow
from qdeploy.core.values import is_finite_number
from qdeploy.pipeline.publish.verify import verify_published
from qdeploy.pipeline.results.identity import model_mismatch, recipe_content_note, run_differences

__all__ = ["HIGHER_IS_BETTER", "Change", "NotComparableError", "RunComparison", "Thresholds", "compare_reports",
           "failure_changes", "format_comparison", "format_regressions", "gate_changes", "latency_changes",
           "latency_noise", "load_report", "metric_changes", "not_comparable", "parse_metric_drops",
           "threshold_line"]

HIGHER_IS_BETTER = {"cosine": True, "snr_db": True, "top1_agreement": True, "top5_agreement": True,
                    "task_metric": True, "max_abs_err": False, "mean_abs_err": False, "max_rel_err": False,
                    "kl": False, "detections_matched": True}
"""Fidelity metrics compared, and which way is better (the recipe's task metric is taken as an accuracy unless
its rows say it is lower-is-better: a built-in perplexity)."""
_BAD_STATUSES = ("failed", "error", "unreadable")
"""A row that was measured and no longer is (the target cannot read the model now) is a regression too."""


@dataclass
class Thresholds:
    """Limits beyond which a change is a regression; None disables that check."""

    max_latency_regression: float | None = None
    """Largest accepted relative growth of median latency (0.1: run B may be 10% slower than run A)."""
    max_metric_drop: dict[str, float] = field(default_factory=dict)
    """Per metric, the largest accepted change in its worse direction (cosine 0.001: may fall by 0.001)."""


@dataclass
class Change:
    """One difference between the runs."""

    kind: str
    """latency, metric, gate, status or missing."""
    subject: str
    """What changed, e.g. 'int8 on ort:cpu, batch 1'."""
    before: Any
    after: Any
    detail: str = ""
    regression: bool = False
    within_noise: bool = False
    """A latency change that the noise of either run covers: never a regression, whatever the thresholds."""


class NotComparableError(QdeployInputError):
    """The two runs are not of the same model, or share nothing to compare (exit 2)."""


@dataclass
class RunComparison:
    """Every change found; `regressions` decide the exit status."""

    changes: list[Change] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    """How the two runs differ besides their measurements (model, recipe, environment): read with care."""
    thresholds: Thresholds = field(default_factory=Thresholds)
    """The limits the changes were judged by (none set: only what is a regression whatever the thresholds)."""
    notes: list[str] = field(default_factory=list)
    """What the comparison could not do as it would for two current reports (an older report's missing field)."""

    @property
    def regressions(self) -> list[Change]:
        return [change for change in self.changes if change.regression]


def load_report(path: Path, *, require_artifacts: bool = False) -> Report:
    """A run's report.json, from the run folder or the file itself; QdeployInputError (exit 2) otherwise.

    Its published files are verified (``verify_published``); ``require_artifacts`` refuses a report.json that
    stands alone, without the artifacts it names."""
    file = path / "report.json" if path.is_dir() else path
    if not file.is_file():
        raise QdeployInputError(f"{path}: no report.json there; give a run folder (qdeploy run --out DIR) "
                                "or its report.json")
    try:
        report = json.loads(file.read_text())
    except (OSError, ValueError) as exc:
        raise QdeployInputError(f"{file}: not a readable report.json: {exc}") from None
    missing = [key for key in ("benchmarks", "validation", "gates")
               if not isinstance(report, dict) or not isinstance(report.get(key), list)]
    if missing:
        raise QdeployInputError(f"{file}: not a qdeploy report (missing {', '.join(missing)})")
    check_layers_section(report, file)  # every reader of report.json validates what it reads (explain: layers)
    # a run folder's published files must be the ones its report describes; a lone report.json is numbers only
    return verify_published(file, report, require_artifacts=require_artifacts)


def compare_reports(before: Report | Mapping[str, Any], after: Report | Mapping[str, Any],
                    thresholds: Thresholds | None = None, *, allow_mismatch: bool = False) -> RunComparison:
    """The changes from run `before` (A) to run `after` (B).

    Raises NotComparableError when the runs are of different models or share no row, unless ``allow_mismatch``
    (then the reasons lead the warnings).
    """
    limits = thresholds or Thresholds()
    unknown = sorted(set(limits.max_metric_drop) - set(HIGHER_IS_BETTER))
    if unknown:
        raise QdeployInputError(f"--max-metric-drop names unknown metric(s) {', '.join(unknown)}; "
                                f"known: {', '.join(HIGHER_IS_BETTER)}")
    before, after = as_report(before, "run A"), as_report(after, "run B")
    refusals = not_comparable(before, after)
    if refusals and not allow_mismatch:
        raise NotComparableError("runs A and B are not comparable: " + "; ".join(refusals)
                                 + ". Pass --allow-mismatch to compare them anyway")
    # the identity checks (qdeploy.pipeline.results.identity) read the JSON form of model and recipe records
    json_a, json_b = before.to_json(), after.to_json()
    note = recipe_content_note(json_a, json_b)
    comparison = RunComparison(warnings=[*refusals, *run_differences(json_a, json_b)], thresholds=limits,
                               notes=[note] if note else [])
    comparison.changes += latency_changes(before.benchmarks, after.benchmarks, limits.max_latency_regression)
    comparison.changes += metric_changes(before.validation, after.validation, limits.max_metric_drop)
    comparison.changes += gate_changes(before.gates, after.gates)
    comparison.changes += failure_changes(before.failures, after.failures)
    return comparison


def not_comparable(before: Report, after: Report) -> list[str]:
    """Why comparing the two runs would compare apples with oranges: a different model, or nothing shared."""
    reasons = model_mismatch(before.to_json(), after.to_json())
    shared_benchmarks = {_bench_key(row) for row in before.benchmarks} & {_bench_key(row) for row in after.benchmarks}
    shared_checks = {(r.variant, r.target) for r in before.validation} & {(r.variant, r.target)
                                                                          for r in after.validation}
    if not shared_benchmarks and not shared_checks and (before.benchmarks or before.validation):
        reasons.append("they share no variant and target: nothing to compare")
    return reasons


def _bench_key(row: BenchmarkRow) -> tuple[str, str, int]:
    return row.variant, row.target, row.batch_size


def latency_changes(before: list[BenchmarkRow], after: list[BenchmarkRow],
                    max_regression: float | None) -> list[Change]:
    """Median latency ratio B/A of every row measured in both runs; a row measured in one run only."""
    old = {_bench_key(row): row for row in before if row.status == "ok" and row.latency_ms}
    new = {_bench_key(row): row for row in after if row.status == "ok" and row.latency_ms}
    changes = []
    for key in sorted(old.keys() | new.keys()):
        subject = f"{key[0]} on {key[1]}, batch {key[2]}"
        if key not in new or key not in old:
            status_after = next((r.status for r in after if _bench_key(r) == key), "absent")
            status_before = next((r.status for r in before if _bench_key(r) == key), "absent")
            lost = key in old  # measured in A, not in B: a value went missing
            changes.append(Change("missing", f"benchmark {subject}", status_before, status_after,
                                  "measured in A only" if lost else "measured in B only",
                                  regression=lost or status_after in _BAD_STATUSES))
            continue
        changes.append(_latency_change(subject, old[key], new[key], max_regression))
    return changes


def _latency_change(subject: str, old: BenchmarkRow, new: BenchmarkRow, max_regression: float | None) -> Change:
    a, b = old.p50, new.p50
    if not is_finite_number(a) or not is_finite_number(b) or a <= 0 or b <= 0:
        return Change("latency", subject, a, b, "a median latency is not a positive number",
                      regression=is_finite_number(a))
    ratio = b / a
    notes = [f"ratio {ratio:.3f}"]
    if old.speedup is not None and new.speedup is not None:
        notes.append(f"speedup vs reference {old.speedup:.3g}x -> {new.speedup:.3g}x")
    noise = _noise_reason(old, new)
    beyond = max_regression is not None and ratio > 1.0 + max_regression
    if noise:
        notes.append(f"within noise: {noise}" + (f"; beyond the {1.0 + max_regression:.4g}x threshold but not a "
                                                  "regression" if beyond else ""))
    elif latency_noise(old) is None and latency_noise(new) is None:
        notes.append("no noise measure recorded")
    else:
        notes.append("beyond the noise either run measured")
    if old.noisy or new.noisy:
        notes.append("noisy: a 95% interval wider than 10% of its median")
    notes += [f"run {label} timed on a busy machine (other processes used {float(load.get('other_cores') or 0):.2f} "
              f"of {load.get('cores')} cores)" for label, load in (("A", old.machine_load), ("B", new.machine_load))
              if load and load.get("busy")]
    return Change("latency", subject, a, b, "; ".join(notes), regression=beyond and not noise,
                  within_noise=bool(noise))


def latency_noise(row: BenchmarkRow) -> float | None:
    """How far (ms) a row's median may move by chance, as its run measured it: the larger of its 95% interval's
    reach from the median and the spread of its per-round medians; None when the row records neither."""
    measures = _noise_measures(row)
    return max(measures)[0] if measures else None


def _noise_measures(row: BenchmarkRow) -> list[tuple[float, str]]:
    measures = []
    stats = row.latency_ms
    if stats is not None and stats.ci95_p50 and len(stats.ci95_p50) == 2:
        reach = max(stats.p50 - stats.ci95_p50[0], stats.ci95_p50[1] - stats.p50)
        measures.append((reach, "95% interval of the median reaches"))
    rounds = [value for value in row.round_p50_ms if is_finite_number(value)]
    if len(rounds) >= 2:  # rounds are separated in time: their spread is the drift a later run also sees
        measures.append((max(rounds) - min(rounds), "per-round medians spread"))
    return measures


def _noise_reason(old: BenchmarkRow, new: BenchmarkRow) -> str:
    """Why the change from `old` to `new` is within the noise of either run; '' when it is not."""
    assert old.latency_ms is not None and new.latency_ms is not None  # only measured rows are compared
    if _intervals_overlap(old.latency_ms.ci95_p50, new.latency_ms.ci95_p50):
        return "the 95% intervals of the medians overlap"
    change = abs(new.latency_ms.p50 - old.latency_ms.p50)
    for label, row in (("A", old), ("B", new)):
        measures = _noise_measures(row)
        if measures and change <= max(measures)[0]:
            noise, what = max(measures)
            return f"a change of {change:.3g} ms, no more than run {label}'s {what} ({noise:.3g} ms)"
    return ""


def _intervals_overlap(first: list[float] | None, second: list[float] | None) -> bool:
    return bool(first and second) and first[0] <= second[1] and second[0] <= first[1]


def metric_changes(before: list[ValidationRow], after: list[ValidationRow],
                   max_drop: dict[str, float]) -> list[Change]:
    """Fidelity metrics that moved, and validation statuses that flipped."""
    old = {(row.variant, row.target): row for row in before}
    new = {(row.variant, row.target): row for row in after}
    changes = []
    for key in sorted(old.keys() & new.keys()):
        subject = f"{key[0]} on {key[1]}"
        was, now = old[key].status, new[key].status
        if was != now:
            changes.append(Change("status", f"validation {subject}", was, now,
                                  regression=now in _BAD_STATUSES and was not in _BAD_STATUSES))
        metrics_a, metrics_b = old[key].metrics, new[key].metrics
        for metric, higher_better in HIGHER_IS_BETTER.items():
            if metric == "task_metric" and "lower" in (old[key].task_metric_direction, new[key].task_metric_direction):
                higher_better = False  # a perplexity: a rise is the regression
            a, b = metrics_a.value(metric), metrics_b.value(metric)
            if is_finite_number(a) and not is_finite_number(b):
                changes.append(Change("metric", f"{metric} of {subject}", a, b,
                                      "missing in B" if b is None else "not a number in B", regression=True))
                continue
            if not is_finite_number(a) or not is_finite_number(b) or a == b:
                continue
            worse_by = (a - b) if higher_better else (b - a)
            limit = max_drop.get(metric)
            changes.append(Change("metric", f"{metric} of {subject}", a, b,
                                  f"{'worse' if worse_by > 0 else 'better'} by {abs(worse_by):.4g}",
                                  regression=limit is not None and worse_by > limit))
    for key in sorted(old.keys() ^ new.keys()):
        lost = key in old and old[key].measured  # A measured it, B did not
        changes.append(Change("missing", f"validation {key[0]} on {key[1]}",
                              old[key].status if key in old else "absent", new[key].status if key in new else "absent",
                              "validated in A only" if key in old else "validated in B only", regression=lost))
    return changes


def _gate_key(gate: GateResult) -> tuple[Any, ...]:
    return gate.variant, gate.target, gate.metric, gate.batch_size, gate.min, gate.max


def _gate_state(gate: GateResult | None) -> str:
    if gate is None:
        return "absent"
    if gate.skipped:
        return "skipped"
    return "pass" if gate.passed else "fail"


def gate_changes(before: list[GateResult], after: list[GateResult]) -> list[Change]:
    """Gates whose verdict differs; one that passed in A and fails in B is a regression."""
    old = {_gate_key(gate): gate for gate in before}
    new = {_gate_key(gate): gate for gate in after}
    changes = []
    for key in sorted(old.keys() | new.keys(), key=str):
        was, now = _gate_state(old.get(key)), _gate_state(new.get(key))
        if was == now:
            continue
        bound = " and ".join(part for part in (f">= {key[4]}" if key[4] is not None else "",
                                               f"<= {key[5]}" if key[5] is not None else "") if part)
        value_a = old[key].value if key in old else None
        value_b = new[key].value if key in new else None
        changes.append(Change("gate", f"{key[0]} on {key[1]}: {key[2]} {bound}", was, now,
                              f"value {_show(value_a)} -> {_show(value_b)}",
                              regression=was == "pass" and now == "fail"))
    return changes


def failure_changes(before: list[BuildFailure], after: list[BuildFailure]) -> list[Change]:
    """Variants that built in A and fail to build in B (a regression), or the reverse."""
    old = {failure.variant: failure for failure in before}
    new = {failure.variant: failure for failure in after}
    changes = [Change("status", f"build of variant {name}", "built", f"failed in {new[name].stage}",
                      new[name].reason, regression=True) for name in sorted(new.keys() - old.keys())]
    changes += [Change("status", f"build of variant {name}", f"failed in {old[name].stage}", "built")
                for name in sorted(old.keys() - new.keys())]
    return changes


def threshold_line(limits: Thresholds) -> str:
    """Which thresholds the changes were judged by, and what is judged without any."""
    parts = []
    if limits.max_latency_regression is not None:
        parts.append(f"median latency of B at most {1.0 + limits.max_latency_regression:.4g}x A's")
    parts += [f"{metric} worse by at most {drop:.4g}" for metric, drop in limits.max_metric_drop.items()]
    if not parts:
        return ("no thresholds set: differences shown, nothing judged (a gate or validation that now fails, a "
                "build that breaks or a value B lost is a regression whatever the thresholds)")
    unjudged = [*(["latency"] if limits.max_latency_regression is None else []),
                *(["fidelity metrics"] if not limits.max_metric_drop else ["other metrics"])]
    return f"thresholds: {'; '.join(parts)} ({' and '.join(unjudged)}: no threshold, not judged)"


def format_comparison(comparison: RunComparison, name_a: str, name_b: str) -> str:
    """A plain-text summary: the thresholds, one line per change, regressions marked, and a verdict."""
    lines = [f"A = {name_a}", f"B = {name_b}", threshold_line(comparison.thresholds), ""]
    if comparison.warnings:
        lines += ["WARNING: the runs differ in more than their measurements; read the changes with care:",
                  *[f"  ! {warning}" for warning in comparison.warnings], ""]
    if comparison.notes:
        lines += [*[f"note: {note}" for note in comparison.notes], ""]
    titles = {"latency": "Median latency (ms), A -> B", "metric": "Fidelity metrics, A -> B",
              "gate": "Gates that flipped", "status": "Statuses that changed", "missing": "In one run only"}
    for kind, title in titles.items():
        group = [change for change in comparison.changes if change.kind == kind]
        if not group:
            continue
        lines.append(title)
        lines += [f"  {_change_line(change)}" for change in group]
        lines.append("")
    lines.append(_verdict_line(comparison))
    return "\n".join(lines)


def format_regressions(comparison: RunComparison, name_a: str, name_b: str) -> str:
    """What `compare -q` prints: the regressed rows and the verdict (a CI log names what regressed); '' when
    nothing regressed."""
    if not comparison.regressions:
        return ""
    lines = [f"compare {name_a} -> {name_b}: {threshold_line(comparison.thresholds)}",
             *[f"  {_change_line(change, kind=True)}" for change in comparison.regressions]]
    if comparison.warnings:
        lines.append(f"  ({len(comparison.warnings)} warning(s) on how the runs differ: run without -q to read them)")
    lines.append(_verdict_line(comparison))
    return "\n".join(lines)


_KIND_LABELS = {"latency": "median latency (ms) of ", "gate": "gate "}
"""What a change's subject does not say itself, for lines printed without their section's title."""


def _change_line(change: Change, *, kind: bool = False) -> str:
    mark = "REGRESSION " if change.regression else ""
    label = _KIND_LABELS.get(change.kind, "") if kind else ""
    detail = f"  ({change.detail})" if change.detail else ""
    return f"{mark}{label}{change.subject}: {_show(change.before)} -> {_show(change.after)}{detail}"


def _verdict_line(comparison: RunComparison) -> str:
    limits, regressions = comparison.thresholds, comparison.regressions
    judged = limits.max_latency_regression is not None or bool(limits.max_metric_drop)
    limit = limits.max_latency_regression
    noise = [change for change in comparison.changes if change.within_noise and limit is not None
             and change.after / change.before > 1.0 + limit]  # within noise: both are positive medians
    spared = f"; {len(noise)} latency change(s) beyond the threshold are within noise, not regressions" \
        if noise else ""
    if regressions:
        return f"{len(regressions)} regression(s){spared}"
    if not judged:
        return "no thresholds set: differences shown, nothing judged; no gate, validation, build or value regressed"
    return f"no regression beyond the thresholds{spared}"


def _show(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def parse_metric_drops(items: list[str]) -> dict[str, float]:
    """['cosine=0.001', 'snr_db=3'] -> {'cosine': 0.001, 'snr_db': 3.0}; QdeployInputError on bad items."""
    drops = {}
    for item in items:
        name, sep, value = item.partition("=")
        try:
            if not sep:
                raise ValueError
            drops[name.strip()] = float(value)
        except ValueError:
            raise QdeployInputError(f"--max-metric-drop '{item}': expected METRIC=VALUE, e.g. cosine=0.001 "
                                    f"(metrics: {', '.join(HIGHER_IS_BETTER)})") from None
    return drops
