"""The Markdown pieces of report.md that issue 18 added or reworked: what to ship per target, the latency and
throughput tables with targets this machine lacks collapsed into one line, and the Pareto fronts per target.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from qdeploy.core.report import Report, as_report
from qdeploy.core.report_parts import VerdictSection
from qdeploy.core.rows import BenchmarkRow, ThroughputRow
from qdeploy.pipeline.report.format import (
    fmt_cosine_cell,
    fmt_ms,
    fmt_number,
    fmt_snr,
    fmt_snr_cell,
    fmt_speedup,
)
from qdeploy.pipeline.report.precision import speedup_sides
from qdeploy.pipeline.report.verdict import compute_verdict
from qdeploy.pipeline.report.verdict_words import tie_rule_words, verdict_lines
from qdeploy.pipeline.report.view import matrix, tradeoff_points, unavailable_line, unavailable_targets

__all__ = ["matrix_lines", "report_verdict", "throughput_lines", "tradeoff_lines", "verdict_markdown"]


def report_verdict(report: Report | Mapping[str, Any]) -> VerdictSection:
    """The report's verdict; computed here for a report written before it had one.  A verdict written before it
    carried what ran (``execution``) keeps its picks and gains that record, derived from the same rows."""
    report = as_report(report)
    section = report.verdict
    if section is None:
        return compute_verdict(report)
    if all(verdict.execution is not None for verdict in section.targets.values() if verdict.status == "ship"):
        return section
    fresh = compute_verdict(report).targets
    completed = {}
    for target, verdict in section.targets.items():
        again = fresh.get(target)
        same = again is not None and again.variant == verdict.variant and again.execution is not None
        completed[target] = verdict.replace(execution=again.execution) if same and again else verdict
    return section.replace(targets=completed)


def verdict_markdown(report: Report | Mapping[str, Any]) -> list[str]:
    """'## What to ship': per target the pick, why, the runner-up and why not the others."""
    report = as_report(report)
    section = report_verdict(report)
    entries = verdict_lines(section, report.packages)
    if not entries:
        return []
    by = {"latency": "median latency at batch", "throughput": "inferences per second at batch",
          "decode": "decode ms per token (a language model with a KV cache) at batch",
          "size": "size (nothing was benchmarked)"}[section.by]
    batch = f" {section.batch_size}" if section.batch_size is not None else ""
    lines = ["## What to ship", "",
             f"Per target, the fastest artifact whose validation passed and whose gates hold (ranked by {by}{batch}); "
             f"{tie_rule_words(section)}. In brackets, how it ran: the artifact's precision, the precision or "
             "kernels that ran and where.", ""]
    for headline, details in entries:
        target, _, rest = headline.partition(": ")
        rest = re.sub(r"^ship (\S+)", r"ship **\1**", rest)
        lines.append(f"- **{target}**: {rest}" if not headline.startswith("Not available") else f"- {headline}.")
        lines += [f"  - {detail}" for detail in details]
    return lines


def matrix_lines(report: Report | Mapping[str, Any]) -> list[str]:
    """The latency and accuracy table; rows of targets this machine lacks collapse into one line below it."""
    report = as_report(report)
    lines = ["| variant | target | precision ran | batch | p50 ms [95% CI] | p90 ms | p99 ms | speedup | "
             "serial rate /s | size MB | peak mem MB | cosine | SNR dB | max abs err | validation | benchmark |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    missing = unavailable_targets(report)
    for row in matrix(report):
        if row.target in missing:
            continue
        latency, bench = row.latency, row.bench
        ci = latency.ci95_p50 if latency else None
        p50 = fmt_number(row.p50) + (f" [{fmt_number(ci[0])}–{fmt_number(ci[1])}]" if ci else "")
        noisy = " (noisy)" if bench is not None and bench.noisy else ""
        metrics = row.metrics
        speedup = fmt_speedup(row.speedup, bench.speedup_range if bench else None)
        lines.append(
            f"| {row.variant} | {row.target} | {row.precision_ran} | {fmt_number(row.batch)} | {p50}{noisy} | "
            f"{fmt_number(latency.p90 if latency else None)} | {fmt_number(latency.p99 if latency else None)} | "
            f"{_speedup_cell(report, bench, speedup)} | "
            f"{fmt_number(bench.throughput_per_s if bench else None)} | {fmt_number(_mb(row.size_bytes))} | "
            f"{fmt_number(row.peak_memory_mb)} | {fmt_cosine_cell(metrics)} | "
            f"{fmt_snr_cell(metrics.snr_db)} | {fmt_number(metrics.max_abs_err)} | "
            f"{row.validation_status} | {row.benchmark_status} |")
    line = unavailable_line(missing)
    return lines + (["", line] if line else [])


def throughput_lines(report: Report | Mapping[str, Any]) -> list[str]:
    """'## Throughput': inferences per second with many requests in flight, and the latency at that load."""
    report = as_report(report)
    missing = unavailable_targets(report)
    rows = [row for row in report.throughput if row.target not in missing]
    if not rows:
        return []
    lines = ["## Throughput (many requests in flight)", "",
             "| variant | target | batch | inferences/s | vs reference | requests in flight | streams × threads "
             "| p50 ms at load | p99 ms at load | status |", "|---|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        latency = row.latency_ms
        lines.append(
            f"| {row.variant} | {row.target} | {fmt_number(row.batch_size)} | "
            f"{fmt_number(row.inferences_per_s)} | "
            f"{_speedup_cell(report, row, fmt_speedup(row.speedup, row.speedup_range))} "
            f"| {fmt_number(row.requests_in_flight)} | {fmt_number(row.streams)} × "
            f"{fmt_number(row.threads_per_request)} | {fmt_number(latency.p50 if latency else None)} | "
            f"{fmt_number(latency.p99 if latency else None)} | {row.status}{': ' + row.reason if row.reason else ''} |")
    lines += ["", "Inferences per second over all timed rounds with every request kept busy (rounds interleaved "
              "with the other artifacts; `vs reference` is the median of per-round ratios); the latency is each "
              "request's own at that load. The serial rate of the latency table is batch / p50 of one request at "
              "a time, not a throughput.", ""]
    seen: set[str] = set()
    for row in rows:
        if row.status == "ok" and row.target not in seen:
            seen.add(row.target)
            settings = ", ".join(f"{key}={value}" for key, value in (row.settings or {}).items())
            lines.append(f"- {row.target}: {row.call}; {settings}")
    return lines


def tradeoff_lines(report: Report | Mapping[str, Any]) -> list[str]:
    """The Pareto front of each target, failed rows left out."""
    points, label = tradeoff_points(report)
    lines = []
    for target in dict.fromkeys(point.target for point in points):
        front = sorted((p for p in points if p.target == target and p.on_front), key=lambda p: p.latency_ms)
        shown = ", ".join(f"{p.variant} ({fmt_ms(p.latency_ms)}, {_fidelity_text(p.fidelity, p.capped, label)})"
                          for p in front)
        lines.append(f"- {target}: {shown}")
    if not lines:
        return []
    return ["", f"Pareto front per target (no other artifact that passed is both faster and closer to the reference "
                f"on that target, by {label}):", "", *lines]


def _fidelity_text(value: float, capped: bool, label: str) -> str:
    if capped:
        return "identical outputs"
    return fmt_snr(value) if label.startswith("SNR") else fmt_number(value, 4)


def _speedup_cell(report: Report, row: BenchmarkRow | ThroughputRow | None, text: str) -> str:
    """The speedup and the precisions it compares: '1.8x: int8 (bf16 float parts) vs fp32 (f32)'."""
    sides = speedup_sides(report, row) if row is not None else ""
    return f"{text}: {sides}" if sides else text


def _mb(size: Any) -> float | None:
    return size / 1e6 if isinstance(size, int | float) else None
