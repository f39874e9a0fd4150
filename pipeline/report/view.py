"""What the human-readable reports show, computed once from report.json: the markdown and HTML writers share it.

Everything here is a pure function of the typed report (``qdeploy.core.report.Report``; a report.json dict is
parsed first), so both writers say the same thing.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from qdeploy.core.compare import SNR_CAP_DB
from qdeploy.core.report import Report, as_report
from qdeploy.core.report_parts import ArtifactRecord
from qdeploy.core.rows import BenchmarkRow, GateResult, LatencyStats, ValidationMetrics, ValidationRow
from qdeploy.core.runtimes import artifact_of
from qdeploy.pipeline.report.format import fmt_number
from qdeploy.pipeline.report.precision import attempts_line, ran_label, same_setting, settings_by_row
from qdeploy.pipeline.report.verdict import split_targets
from qdeploy.pipeline.report.verdict_words import short_reason

__all__ = ["FIDELITY_METRICS", "HIGHLIGHT_WORDS", "MatrixRow", "TradeoffPoint", "benchmark_settings",
           "fidelity_metric", "gate_bound", "gate_label", "gate_verdict", "has_task_metric", "highlights",
           "lineage_chain", "mark_pareto_front", "matrix", "problems", "summarize_value", "task_metric_label",
           "tradeoff_points", "unmeasured_lines", "validation_notes"]

FIDELITY_METRICS: tuple[tuple[str, str], ...] = (
    ("task_metric", "task metric (validate.metric)"), ("snr_db", "SNR (dB) vs reference"),
    ("cosine", "cosine vs reference"))
"""The accuracy of the accuracy-vs-latency view, the first one measured wins; higher is taken as better (the
recipe's task metric is assumed to be an accuracy-like score, not a loss)."""
HIGHLIGHT_WORDS = ("clamp", "kept", "blocked", "lowered", "exclud", "fallback", "warning", "unattainable", "overflow",
                   "diverg", "drift", "skipped", "failed", "unchecked")
"""Findings whose key holds one of these words are worth a line outside the collapsed details."""


@dataclass
class MatrixRow:
    """One (variant, target, batch) of the report's table, validation and benchmark joined."""

    variant: str
    target: str
    batch: int | None
    bench: BenchmarkRow | None = None
    check: ValidationRow | None = None
    size_bytes: int | None = None

    @property
    def latency(self) -> LatencyStats | None:
        return self.bench.latency_ms if self.bench is not None else None

    @property
    def p50(self) -> float | None:
        return self.bench.p50 if self.bench is not None else None

    @property
    def metrics(self) -> ValidationMetrics:
        return self.check.metrics if self.check is not None else ValidationMetrics()

    @property
    def validation_status(self) -> str:
        if self.check is None:
            return "–"
        return "unreadable" if self.check.unreadable else self.check.status

    @property
    def benchmark_status(self) -> str:
        if self.bench is None:
            return "–"
        if self.check is not None and self.check.unreadable and self.bench.status == "error":
            return "unreadable"  # the target cannot read the original model: said once, not per row
        return self.bench.status

    @property
    def speedup(self) -> float | None:
        return self.bench.speedup if self.bench is not None else None

    @property
    def speedup_undecided(self) -> bool:
        """The per-round speedups straddle 1: this run cannot say which of the two is faster."""
        low_high = self.bench.speedup_range if self.bench is not None else None
        return bool(low_high) and low_high[0] < 1.0 < low_high[1]

    @property
    def precision_ran(self) -> str:
        """The precision this row's numbers ran at, from its own rows: the benchmark's, and the validation's too
        where they differ (a pin validation ships that this benchmark did not time)."""
        timed = ran_label(self.bench) if self.bench is not None else "–"
        checked = ran_label(self.check) if self.check is not None else "–"
        if checked == "–" or (timed != "–" and self.bench is not None and self.check is not None
                              and not same_setting(self.bench, self.check)):
            return timed if checked == "–" else f"validated {checked}; timed {timed}"
        return checked

    @property
    def peak_memory_mb(self) -> float | None:
        return ((self.bench.memory if self.bench is not None else None) or {}).get("peak_growth_mb")

    @property
    def status(self) -> str:
        """One word for the row: unreadable (the target cannot read the original model), failed, error,
        unavailable, ok."""
        states = {self.validation_status, self.benchmark_status}
        if "unreadable" in states:
            return "unreadable"
        for word in ("failed", "error", "unavailable"):
            if word in states:
                return word
        return "ok"


def matrix(report: Report | Mapping[str, Any]) -> list[MatrixRow]:
    """Every benchmarked (variant, target, batch), plus validated pairs that have no benchmark row."""
    report = as_report(report)
    sizes = report.sizes
    checks = {(row.variant, row.target): row for row in report.validation}
    rows = []
    seen = set()
    for bench in report.benchmarks:
        key = (bench.variant, bench.target)
        seen.add(key)
        rows.append(MatrixRow(bench.variant, bench.target, bench.batch_size, bench, checks.get(key),
                              sizes.get(artifact_of(bench.variant))))
    for key, check in checks.items():
        if key not in seen:
            rows.append(MatrixRow(key[0], key[1], None, None, check, sizes.get(artifact_of(key[0]))))
    return rows


def has_task_metric(report: Report) -> bool:
    return any(row.metrics.has("task_metric") for row in report.validation)


def task_metric_label(report: Report) -> str:
    """The task metric's column title: its name and which way is better when the rows say ('task metric' for a
    report written before they did)."""
    row = next((row for row in report.validation if row.task_metric_name), None)
    if row is None:
        return "task metric"
    arrow = {"lower": " (lower is better)", "higher": ""}.get(row.task_metric_direction or "higher", "")
    return f"{row.task_metric_name}{arrow}"


def gate_bound(gate: GateResult) -> str:
    parts = [f">= {fmt_number(gate.min, 4, style='value')}" if gate.min is not None else "",
             f"<= {fmt_number(gate.max, 4, style='value')}" if gate.max is not None else ""]
    return " and ".join(part for part in parts if part)


def gate_verdict(gate: GateResult) -> str:
    """PASS, FAIL or SKIP."""
    if gate.skipped:
        return "SKIP"
    return "PASS" if gate.passed else "FAIL"


def gate_label(gate: GateResult) -> str:
    batch = f" (batch {gate.batch_size})" if gate.batch_size != 1 else ""
    return f"{gate.variant} on {gate.target}: {gate.metric}{batch} {gate_bound(gate)}"


def fidelity_metric(report: Report) -> tuple[str, str] | None:
    """(key, label) of the fidelity metric measured for the most rows."""
    for key, label in FIDELITY_METRICS:
        if key == "task_metric" and any(row.task_metric_direction == "lower" for row in report.validation):
            continue  # the view takes higher as better: a perplexity would draw the front upside down
        if any(isinstance(row.metrics.value(key), int | float) for row in report.validation):
            return key, label
    return None


@dataclass
class TradeoffPoint:
    """A (variant, target) at the smallest measured batch: latency against fidelity."""

    variant: str
    target: str
    latency_ms: float
    fidelity: float
    on_front: bool = False
    capped: bool = False
    """The SNR is at its cap (identical outputs): drawn just above the highest measured one, not at 200 dB."""


def tradeoff_points(report: Report | Mapping[str, Any]) -> tuple[list[TradeoffPoint], str]:
    """Points of the accuracy-vs-latency view with each target's Pareto front marked, and the fidelity label.

    Only rows whose validation passed are points: a failed artifact is no trade-off.  Capped SNRs (identical
    outputs) are drawn at the highest measured SNR + 10 dB so that the cap does not flatten the axis.
    """
    report = as_report(report)
    metric = fidelity_metric(report)
    if metric is None:
        return [], ""
    key, label = metric
    batches = [row.batch_size for row in report.benchmarks if row.status == "ok"]
    if not batches:
        return [], label
    smallest = min(batches)
    points = []
    for row in matrix(report):
        value = row.metrics.value(key)
        p50 = row.p50
        if row.batch == smallest and row.benchmark_status == "ok" and row.validation_status == "passed" \
                and isinstance(value, int | float) and isinstance(p50, int | float) and math.isfinite(value):
            points.append(TradeoffPoint(row.variant, row.target, float(p50), float(value)))
    if key == "snr_db":
        _uncap_snr(points)
    for target in dict.fromkeys(point.target for point in points):
        mark_pareto_front([point for point in points if point.target == target])
    return points, label


def _uncap_snr(points: list[TradeoffPoint]) -> None:
    measured = [p.fidelity for p in points if p.fidelity < SNR_CAP_DB]
    shown = (max(measured) + 10.0) if measured else 60.0
    for point in points:
        if point.fidelity >= SNR_CAP_DB:
            point.fidelity, point.capped = shown, True


def mark_pareto_front(points: list[TradeoffPoint]) -> None:
    """Mark the points no other point beats on both latency (lower) and fidelity (higher)."""
    for point in points:
        point.on_front = not any(
            other.latency_ms <= point.latency_ms and other.fidelity >= point.fidelity
            and (other.latency_ms < point.latency_ms or other.fidelity > point.fidelity)
            for other in points)


def unavailable_targets(report: Report) -> dict[str, str]:
    """Targets this machine lacks (every validation row unavailable) -> why; their rows collapse into one line."""
    if report.verdict is not None:
        return dict(report.verdict.unavailable)
    return split_targets(report)[1]


def unavailable_line(missing: dict[str, str]) -> str:
    """'Not available on this machine: ort:cuda, openvino:gpu (this machine's onnxruntime has ...).'"""
    if not missing:
        return ""

    reasons = "; ".join(dict.fromkeys(short_reason(reason) for reason in missing.values()))
    return f"Not available on this machine: {', '.join(missing)} ({reasons})."


def problems(report: Report) -> list[str]:
    """Failed builds, then failed, unavailable or erroneous rows with their reasons.

    Rows of one target that share a status and a reason are said once, naming their variants.
    """
    lines = [f"variant {failure.variant}, stage {failure.stage}: {failure.reason}" for failure in report.failures]
    grouped: dict[tuple[str, str, str], list[str]] = {}
    missing = unavailable_targets(report)  # said once, in the line that collapses their rows
    unreadable = report.unreadable_targets
    lines += [f"{why} (so no variant runs on {target}: not a failure of a variant)"
              for target, why in unreadable.items()]
    not_run = {(row.variant, row.target) for row in report.validation if row.unreadable}
    for row in [*report.validation, *report.benchmarks, *report.throughput]:
        if row.status in ("passed", "ok") or not row.reason or row.target in missing:
            continue
        if (row.variant, row.target) in not_run and row.target in unreadable:
            continue  # said once above
        variants = grouped.setdefault((row.target, row.status, row.reason), [])
        if row.variant not in variants:
            variants.append(row.variant)
    for (target, status, reason), variants in grouped.items():
        lines.append(f"{', '.join(variants)} on {target} ({status}): {reason}")
    return lines


def unmeasured_lines(report: Report) -> list[str]:
    """What the recipe asked to measure and could not be, one line each; allowed ones say so."""
    lines = []
    for row in report.unmeasured:
        batch = f", batch {row.batch_size}" if row.batch_size is not None else ""
        allowed = " (allowed by report.allow_unmeasured)" if row.allowed else ""
        lines.append(f"{row.kind} of {row.variant} on {row.target}{batch}: {row.reason}{allowed}")
    return lines


def validation_notes(row: ValidationRow) -> list[str]:
    """Divergence, unattainable limits and warnings of one validation row, as sentences."""
    notes = []
    divergence = row.divergence
    if divergence:
        notes.append(
            f"first diverging node {divergence.get('node', '?')} ({divergence.get('op_type', '?')}), tensor "
            f"{divergence.get('tensor', '?')}: max abs err {fmt_number(divergence.get('max_abs_err'), style='value')}, "
            f"cosine {fmt_number(divergence.get('cosine'), 6, style='value')}")
    attempts = attempts_line(row)
    notes += [attempts] if attempts else []
    notes += [f"unattainable: {item}" for item in row.unattainable]
    notes += [str(item) for item in row.warnings]
    return notes


def highlights(findings: Any, prefix: str = "") -> list[str]:
    """Lines for findings worth reading without opening the details: non-empty values under telling keys."""
    lines: list[str] = []
    if not isinstance(findings, dict):
        return lines
    for key, value in findings.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and (not _telling(key) or any(_telling(str(inner)) for inner in value)):
            lines += highlights(value, path + ".")  # a record with telling fields of its own speaks through them
        elif _telling(key) and not _empty(value):
            lines.append(f"{path}: {summarize_value(value)}")
    return lines


def _telling(key: str) -> bool:
    return any(word in key.lower() for word in HIGHLIGHT_WORDS)


def _empty(value: Any) -> bool:
    if isinstance(value, bool):
        return not value
    if isinstance(value, int | float):
        return value == 0
    return value is None or (isinstance(value, list | dict | str) and not value)


def summarize_value(value: Any, limit: int = 8) -> str:
    """A value on one line: lists cut after `limit` items, dicts as key=value."""
    if isinstance(value, list):
        shown = ", ".join(summarize_value(item, limit) for item in value[:limit])
        return shown + (f", … (+{len(value) - limit} more)" if len(value) > limit else "")
    if isinstance(value, dict):
        items = list(value.items())
        shown = ", ".join(f"{key}={summarize_value(item, limit)}" for key, item in items[:limit])
        return "{" + shown + (f", … (+{len(items) - limit} more)" if len(items) > limit else "") + "}"
    return fmt_number(value, 4, style="value")


def lineage_chain(artifact: ArtifactRecord) -> str:
    return artifact.chain()


def benchmark_settings(report: Report) -> list[str]:
    """How the numbers were measured, per target, each statement from the rows it describes: the plan (mode,
    warm-up, runs, rounds, threads) said once where every row shares it, else per group of rows that share it;
    the runtime settings every row shares; per row those that differ (the inference precision, above all)."""
    lines = []
    measured = [row for row in report.benchmarks if row.status == "ok"]
    for target in dict.fromkeys(row.target for row in measured):
        rows = [row for row in measured if row.target == target]
        plans: dict[str, list[str]] = {}
        for row in rows:
            variants = plans.setdefault(_plan(row), [])
            variants += [row.variant] if row.variant not in variants else []
        shared, differing = settings_by_row(rows)
        settings = ", ".join(f"{key}={value}" for key, value in shared.items())
        if len(plans) == 1:
            lines.append(f"{target}: {next(iter(plans))}" + (f"; {settings}" if settings else ""))
        else:
            lines += [f"{target}, {', '.join(variants)}: {plan}" for plan, variants in plans.items()]
            lines += [f"{target}: every row: {settings}"] if settings else []
        lines += [f"{target}: {key} per row: {', '.join(values)}" for key, values in differing.items()]
        ran = list(dict.fromkeys(f"{item.variant}: {ran_label(item)}" for item in rows))
        lines.append(f"{target}: inference precision that ran, per row: {'; '.join(ran)}")
    return lines + _benchmark_data_lines(report)


def _plan(row: BenchmarkRow) -> str:
    """The measurement plan of one benchmark row, in words."""
    measure = row.measure or {}
    warm = (f"{measure['warmup_seconds']} s" if measure.get("warmup") == "time"
            else f"{fmt_number(row.warmup, style='value')} runs")
    timed = f"{measure['duration_seconds']} s per artifact" if measure.get("by") == "time" else f"{row.runs} runs"
    return (f"{row.mode or 'sync'}; warm-up {warm}; measured {timed} in "
            f"{measure.get('rounds', len(row.round_p50_ms))} interleaved rounds; threads "
            f"{row.threads or 'runtime default'}")


def _benchmark_data_lines(report: Report) -> list[str]:
    """What the benchmarks were fed, then each row's notes (wrong output declarations, stops), said once."""
    rows = [row for row in report.benchmarks if row.status == "ok"]
    sources = list(dict.fromkeys(str(row.data.get("source")) for row in rows if row.data))
    lines = [f"inputs: {source}, stacked to each batch size" for source in sources]
    notes: dict[str, list[str]] = {}
    for row in rows:
        for note in row.notes:
            notes.setdefault(str(note), []).append(f"{row.variant} on {row.target} batch {row.batch_size}")
    lines += [f"{', '.join(where)}: {note}" for note, where in notes.items()]
    return lines
