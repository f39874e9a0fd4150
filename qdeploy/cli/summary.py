"""What `qdeploy run` prints when it ends: the table, the verdict with its reasons, gates, packages, reports.

In a terminal Rich lays it out to the window's width.  Without one (a CI log, a pipe) the output is plain: no
colours, one row a line, no cell folded: a log has no width to fit, and a number split across two lines
("0.99999998" / "4") is misread.  The numbers are worded as in report.md (the same formatters).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from qdeploy.core.report import Report, as_report
from qdeploy.core.rows import ValidationMetrics
from qdeploy.pipeline.report.format import fmt_cosine_cell, fmt_number, fmt_snr_cell, fmt_speedup
from qdeploy.pipeline.report.precision import speedup_sides
from qdeploy.pipeline.report.verdict_words import verdict_lines
from qdeploy.pipeline.report.view import (
    MatrixRow,
    gate_label,
    gate_verdict,
    matrix,
    unavailable_line,
    unavailable_targets,
)

__all__ = ["MAX_DETAILS", "PLAIN_WIDTH", "print_summary"]

PLAIN_WIDTH = 100_000
"""Columns of the summary when stdout is no terminal: more than any row needs, so that none folds (Rich pads a
table to its own width only, never to the console's)."""
MAX_DETAILS = 6
"""Detail lines (runner-up, "not X: why") shown per target; more are counted, and report.md lists them all."""


def print_summary(report: Report | Mapping[str, Any], out_dir: Path) -> None:
    from rich.console import Console

    report = as_report(report)
    console = Console()
    if not console.is_terminal:  # CI logs: rows on one line each, never numbers folded at 80 columns
        console = Console(width=PLAIN_WIDTH, soft_wrap=True)
    _print_tables(console, report)
    _print_verdict(console, report)
    _print_outcome(console, report, out_dir)


def _print_tables(console: Any, report: Report) -> None:
    from rich import box
    from rich.table import Table


    plain = not console.is_terminal
    missing = unavailable_targets(report)
    rows = [row for row in matrix(report) if row.target not in missing]
    batches = len({row.batch for row in rows if row.batch is not None}) > 1
    table = Table(title=f"qdeploy: {report.recipe.name}", box=box.SIMPLE_HEAD)
    columns = ("variant", "target", "precision ran", *(("batch",) if batches else ()), "p50 ms", "speedup",
               "cosine", "SNR dB", "status")
    for column in columns:
        table.add_column(column, no_wrap=plain or column in ("variant", "target", "status"), overflow="fold")
    for row in rows:
        bench = row.bench
        p50 = fmt_number(row.p50) + ("*" if bench is not None and bench.noisy else "")
        sides = speedup_sides(report, bench) if bench is not None else ""
        speed = fmt_speedup(row.speedup, bench.speedup_range if bench else None) + (f": {sides}" if sides else "")
        cosine, snr = fidelity_cells(row.metrics)
        batch = (fmt_number(row.batch, style="value"),) if batches else ()
        cells = [row.variant, row.target, row.precision_ran, *batch, p50, speed, cosine, snr, row.status]
        table.add_row(*cells, style="dim" if row.status == "unavailable" else None)
    console.print(table)
    if any(row.bench is not None and row.bench.noisy for row in rows):
        console.print("* noisy: the 95% interval of the median is wider than 10% of it", highlight=False)
    for line in added_target_lines(rows):
        console.print(line, style="dim", highlight=False)
    if missing:
        console.print(unavailable_line(missing), style="dim", highlight=False)
    shown = [row for row in report.throughput if row.target not in missing]
    if shown:
        rates = Table(title="throughput (p50: latency at that load)", box=box.SIMPLE_HEAD)
        for column in ("variant", "target", "inf/s", "vs ref", "in flight", "p50 ms", "status"):
            rates.add_column(column, no_wrap=plain or column in ("variant", "target"), overflow="fold")
        for rate in shown:
            rates.add_row(rate.variant, rate.target, fmt_number(rate.inferences_per_s),
                          fmt_speedup(rate.speedup, rate.speedup_range), fmt_number(rate.requests_in_flight),
                          fmt_number(rate.latency_ms.p50 if rate.latency_ms else None), rate.status)
        console.print(rates)


def fidelity_cells(metrics: ValidationMetrics) -> tuple[str, str]:
    """Cosine and SNR as report.md's table words them: '1 − 1e-16', 'identical outputs' at the SNR cap (200 dB
    is the cap, not a measurement), '52.1'."""
    return fmt_cosine_cell(metrics), fmt_snr_cell(metrics.snr_db)


def added_target_lines(rows: list[MatrixRow]) -> list[str]:
    """Why a target the recipe does not name has rows: qdeploy added it (the fp16 true-precision check)."""
    added: dict[str, str] = {}
    for row in rows:
        if row.check is not None and row.check.added:
            added.setdefault(row.target, row.check.added)
    return [f"{target}: not a target of the recipe; qdeploy added it as the {why} (CPU providers compute float16 "
            "in float32, onnx.reference as declared); accuracy only, not timed; validate.fp16_reference: never "
            "leaves it out" for target, why in added.items()]


def verdict_detail_lines(details: list[str], limit: int = MAX_DETAILS) -> list[str]:
    """A target's runner-up and "not X" reasons: every one up to ``limit``, then a count of the rest."""
    if len(details) <= limit:
        return details
    return [*details[:limit - 1], f"and {len(details) - limit + 1} more reasons in report.md"]


def _print_verdict(console: Any, report: Report) -> None:
    for headline, details in verdict_lines(report.verdict, report.packages):
        if headline.startswith("Not available"):  # said once already, under the table
            continue
        console.print(headline, highlight=False)
        for detail in verdict_detail_lines(details):
            console.print(f"  {detail}", style="dim", highlight=False)


def _print_outcome(console: Any, report: Report, out_dir: Path) -> None:
    from rich.markup import escape


    styles = {"PASS": "[green]PASS[/green]", "FAIL": "[red]FAIL[/red]", "SKIP": "[yellow]SKIP[/yellow]"}
    for gate in report.gates:
        reason = f" {gate.reason}" if gate.reason else ""
        label = escape(f"gate {gate_label(gate)}: {fmt_number(gate.value, 4, style='value')}{reason}")
        console.print(f"{styles[gate_verdict(gate)]} {label}", markup=True, highlight=False)
    for failure in report.failures:
        console.print(f"[red]FAILED[/red] variant {failure.variant} at stage {failure.stage}: "
                      f"{escape(failure.reason)}", markup=True, highlight=False)
    packages = report.packages
    for failed in packages.failed if packages else []:
        why = escape(f"for {failed.variant} on {failed.target}: {failed.reason}")
        console.print(f"[yellow]no package[/yellow] {why}", markup=True, highlight=False)
    if packages is not None and packages.written:
        console.print(f"packages: {len(packages.written)} in {out_dir / 'packages'} (docs/packages.md)",
                      highlight=False)
    written = [name for name in ("report.html", "report.md", "report.json") if (out_dir / name).is_file()]
    console.print(f"report: {', '.join(str(out_dir / name) for name in written)}", highlight=False)
