"""The sweep report: sweep.json (for machines), sweep.md and sweep.html (for people).

What to ship per recipe and target (each recipe's own verdict: the pick, how it ran, why, its package), one row
per recipe, variant and available target (validation, latency, speedup, gates; the targets this machine lacks in
one line with the recipes that asked for them), the failures with their reasons, links to each recipe's own
report, and the timeline of work items (kind, recipe, start, end, node, pid).
Exit status of the sweep: 2 when any recipe is invalid, else 1 when any failed (a gate, a stage, a crash),
else 0.
"""

from __future__ import annotations

import html
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from qdeploy.core.files import write_json_atomic, write_text_atomic
from qdeploy.core.report import Report, as_report
from qdeploy.core.rows import BenchmarkRow, GateResult
from qdeploy.pipeline.report.precision import execution_phrase
from qdeploy.pipeline.report.tables import report_verdict
from qdeploy.pipeline.report.verdict_words import describe, in_recipe_order, package_of, short_reason
from qdeploy.pipeline.sweep.report_model import (
    ExecutorDescription,
    FailureEntry,
    GateCounts,
    RecipeRow,
    SweepMatrixRow,
    SweepReport,
    TimelineRecord,
    UnavailableEntry,
    VerdictEntry,
)

if TYPE_CHECKING:
    from qdeploy.pipeline.sweep.jobs import Job
    from qdeploy.pipeline.sweep.work import WorkRecord

__all__ = ["MATRIX_HEADER", "RECIPE_HEADER", "STATUSES", "SWEEP_SCHEMA_VERSION", "TIMELINE_HEADER",
           "build_sweep_report", "render_sweep_html", "render_sweep_markdown", "sweep_exit_code", "write_sweep_reports"]

SWEEP_SCHEMA_VERSION = 1
STATUSES = ("passed", "failed", "invalid", "error")


def sweep_exit_code(statuses: list[str]) -> int:
    if "invalid" in statuses:
        return 2
    return 1 if any(status != "passed" for status in statuses) else 0


def build_sweep_report(name: str, jobs: list[Job], timeline: list[WorkRecord], executor: ExecutorDescription,
                       out_dir: Path, *, started: float, seconds: float) -> SweepReport:
    """The sweep report (``to_json()``: sweep.json)."""
    recipes = [_recipe_row(job, out_dir) for job in jobs]
    statuses = [row.status for row in recipes]
    return SweepReport.model_validate({
        "schema_version": SWEEP_SCHEMA_VERSION,
        "sweep": name,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "started_at": started,
        "seconds": seconds,
        "executor": executor,
        "exit_code": sweep_exit_code(statuses),
        "passed": all(status == "passed" for status in statuses),
        "counts": {status: statuses.count(status) for status in STATUSES} | {"recipes": len(statuses)},
        "recipes": recipes,
        "verdicts": [entry for job in jobs for entry in _verdicts(job)],
        "unavailable": _unavailable(jobs),
        "rows": [row for job in jobs for row in _matrix_rows(job)],
        "failures": [failure for job in jobs for failure in _failures(job)],
        "timeline": [{**record, "start": round(record["start"] - started, 4), "end": round(record["end"] - started, 4)}
                     for record in timeline],
    })


def _recipe_row(job: Job, out_dir: Path) -> RecipeRow:
    links = {}
    for kind in ("json", "md", "html"):
        path = job.folder / f"report.{kind}"
        if job.result is not None and path.is_file():
            links[kind] = os.path.relpath(path, out_dir)
    report = _report_of(job)
    gates = report.gates if report is not None else []
    return RecipeRow(
        name=job.entry.name, origin=job.entry.origin, status=job.status, reason=job.reason,
        exit_code=job.result.exit_code if job.result is not None else (2 if job.status == "invalid" else 1),
        folder=os.path.relpath(job.folder, out_dir), reports=links,
        seconds=report.seconds if report is not None else None,
        gates=GateCounts(passed=sum(g.passed is True for g in gates), failed=sum(g.passed is False for g in gates),
                         skipped=sum(g.passed is None for g in gates)))


def _report_of(job: Job) -> Report | None:
    """The finished recipe's report, typed; None for a recipe that did not finish."""
    return as_report(job.result.report, f"{job.folder / 'report.json'}") if job.result is not None else None


def _verdicts(job: Job) -> list[VerdictEntry]:
    """The recipe's verdict per target, as its own report says it: the pick, how it ran, why, its package."""
    report = _report_of(job)
    if report is None:
        return []
    entries = []
    for target, verdict in in_recipe_order(report_verdict(report)):
        ships = verdict.status == "ship" and verdict.variant is not None
        entries.append(VerdictEntry(
            recipe=job.entry.name, target=target, status=verdict.status, variant=verdict.variant, why=verdict.why,
            ran=execution_phrase(verdict.execution) if ships else "", numbers=describe(verdict) if ships else "",
            package=package_of(report.packages, target, verdict.variant or "") if ships else ""))
    return entries


def _unavailable(jobs: list[Job]) -> list[UnavailableEntry]:
    """The targets this machine lacks, each once, with its reason and the recipes that asked for it."""
    found: dict[str, UnavailableEntry] = {}
    for job in jobs:
        report = _report_of(job)
        if report is None:
            continue
        for target, reason in report_verdict(report).unavailable.items():
            entry = found.setdefault(target, UnavailableEntry(target=target, reason=short_reason(reason)))
            entry.recipes.append(job.entry.name)
    return list(found.values())


def _matrix_rows(job: Job) -> list[SweepMatrixRow]:
    """One row per variant and available target of a finished recipe (the targets this machine lacks are said
    once, in ``unavailable``); one row saying why for a recipe that did not finish."""
    report = _report_of(job)
    if report is None:
        return [_row(job.entry.name, None, None, status=job.status, reason=job.reason)]
    rows = []
    gates = report.gates
    benchmarks = report.benchmarks
    missing = report_verdict(report).unavailable
    for check in report.validation:
        variant, target = check.variant, check.target
        if target in missing:
            continue
        bench = _first_benchmark(benchmarks, variant, target)
        timed = {} if bench is None else {"benchmark": bench.status, "batch_size": bench.batch_size,
                                          "p50_ms": bench.p50, "speedup": bench.speedup}
        rows.append(_row(job.entry.name, variant, target, status=check.status, reason=check.reason or None,
                         cosine=check.metrics.cosine, **timed, gates=_gate_verdict(gates, variant, target)))
    targets = [target for target in (job.plan.targets if job.plan is not None else []) if target not in missing]
    for failure in report.failures:
        rows += [_row(job.entry.name, failure.variant, target, status="failed",
                      reason=f"stage {failure.stage}: {failure.reason}",
                      gates=_gate_verdict(gates, failure.variant, target)) for target in targets]
    return rows


def _row(recipe: str, variant: str | None, target: str | None, **values: Any) -> SweepMatrixRow:
    base = {"recipe": recipe, "variant": variant, "target": target, "status": None, "reason": None, "cosine": None,
            "benchmark": None, "batch_size": None, "p50_ms": None, "speedup": None, "gates": None}
    return SweepMatrixRow.model_validate({**base, **values})


def _first_benchmark(benchmarks: list[BenchmarkRow], variant: str, target: str) -> BenchmarkRow | None:
    rows = [row for row in benchmarks if row.variant == variant and row.target == target]
    return min(rows, key=lambda row: row.batch_size) if rows else None


def _gate_verdict(gates: list[GateResult], variant: str, target: str) -> str | None:
    verdicts = [gate.passed for gate in gates if gate.variant == variant and gate.target == target
                and gate.passed is not None]
    if not verdicts:
        return None
    return "PASS" if all(verdicts) else "FAIL"


def _failures(job: Job) -> list[FailureEntry]:
    report = _report_of(job)
    if report is None:
        return [FailureEntry(recipe=job.entry.name, variant=None, stage=None, status=job.status, reason=job.reason)]
    failures = [FailureEntry(recipe=job.entry.name, variant=f.variant, stage=f.stage, status="failed",
                             reason=f.reason) for f in report.failures]
    failures += [FailureEntry(recipe=job.entry.name, variant=g.variant, stage="gate", status="failed",
                              reason=f"{g.metric} on {g.target} = {g.value} (min {g.min}, max {g.max}) "
                                     f"{g.reason or ''}".rstrip())
                 for g in report.gates if g.passed is False]
    return failures


def write_sweep_reports(report: SweepReport, out_dir: Path) -> list[Path]:
    """sweep.json, sweep.md and sweep.html in the sweep's folder, each written atomically."""
    paths = [out_dir / "sweep.json", out_dir / "sweep.md", out_dir / "sweep.html"]
    write_json_atomic(paths[0], report.to_json())
    write_text_atomic(paths[1], render_sweep_markdown(report))
    write_text_atomic(paths[2], render_sweep_html(report))
    return paths


def _fmt(value: Any, digits: int = 3) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def _recipe_cells(row: RecipeRow) -> list[str]:
    return [row.name, row.status, f"{row.gates.passed} passed, {row.gates.failed} failed", _fmt(row.seconds, 1),
            row.reason or ""]


def _matrix_cells(row: SweepMatrixRow) -> list[str]:
    speedup = f"{row.speedup:.2f}x" if row.speedup else "–"
    return [row.recipe, row.variant or "–", row.target or "–", row.status or "–", _fmt(row.cosine, 6),
            row.benchmark or "–", _fmt(row.p50_ms), speedup, row.gates or "–", row.reason or ""]


MATRIX_HEADER = ["recipe", "variant", "target", "validation", "cosine", "benchmark", "p50 ms", "speedup", "gates",
                 "reason"]
RECIPE_HEADER = ["recipe", "status", "gates", "seconds", "reason"]
TIMELINE_HEADER = ["kind", "recipe", "start s", "end s", "node", "pid"]


def _timeline_cells(record: TimelineRecord) -> list[str]:
    return [record.kind, record.recipe, _fmt(record.start, 2), _fmt(record.end, 2), str(record.node),
            str(record.pid)]


def _md_table(header: list[str], rows: list[list[str]]) -> list[str]:
    def clean(cell: str) -> str:
        return cell.replace("|", "\\|").replace("\n", " ")

    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header),
            *["| " + " | ".join(clean(cell) for cell in row) + " |" for row in rows]]


def _failure_line(failure: FailureEntry) -> str:
    return (failure.recipe + (f" / {failure.variant}" if failure.variant else "")
            + (f" at {failure.stage}" if failure.stage else "") + f" ({failure.status}): {failure.reason}")


def render_sweep_markdown(report: SweepReport | dict[str, Any]) -> str:
    report = SweepReport.of(report)
    counts = report.counts
    recipe_rows = []
    for row in report.recipes:
        cells = _recipe_cells(row)
        if row.reports.get("md"):
            cells[0] = f"[{row.name}]({row.reports['md']})"
        recipe_rows.append(cells)
    parts = [f"# qdeploy sweep: {report.sweep}", "",
             f"{counts['recipes']} recipes: {counts['passed']} passed, {counts['failed']} failed, "
             f"{counts['invalid']} invalid, {counts['error']} errors; exit status {report.exit_code}. "
             f"Executor: {report.executor.kind}; took {report.seconds:.1f} s.",
             "", "## Recipes", "", *_md_table(RECIPE_HEADER, recipe_rows)]
    if report.verdicts:
        parts += ["", "## What to ship", "", "Per recipe and target, the recipe's own verdict (its report.md says why "
                  "not the others).", "", *[f"- {line}" for line in _verdict_lines(report)]]
    parts += ["", "## Variants and targets", "", *_md_table(MATRIX_HEADER, [_matrix_cells(r) for r in report.rows]),
              *(["", line] if (line := _unavailable_line(report)) else [])]
    if report.failures:
        parts += ["", "## Failures", "", *[f"- {_failure_line(failure)}" for failure in report.failures]]
    parts += ["", "## Timeline", "", "Seconds from the start of the sweep; benchmarks ran alone on their node.", "",
              *_md_table(TIMELINE_HEADER, [_timeline_cells(r) for r in report.timeline]), ""]
    return "\n".join(parts)


def _verdict_lines(report: SweepReport) -> list[str]:
    """'recipe on target: ship int8 (how it ran): numbers; why; package ...' or '... nothing to ship: why'."""
    lines = []
    for entry in report.verdicts:
        head = f"{entry.recipe} on {entry.target}: "
        if entry.status != "ship":
            lines.append(head + f"nothing to ship: {entry.why}")
            continue
        ran = f" ({entry.ran})" if entry.ran else ""
        lines.append(head + f"ship {entry.variant}{ran}: {entry.numbers}; {entry.why}"
                     + (f"; {entry.package}" if entry.package else ""))
    return lines


def _unavailable_line(report: SweepReport) -> str:
    """The targets this machine lacks, in one line: their rows are not repeated per variant.  Targets lacking for
    the same recipes are said together; the recipes that asked for each are named."""
    if not report.unavailable:
        return ""
    groups: dict[tuple[str, ...], list[UnavailableEntry]] = {}
    for entry in report.unavailable:
        groups.setdefault(tuple(entry.recipes), []).append(entry)
    parts = [f"{', '.join(entry.target for entry in entries)} "
             f"({'; '.join(dict.fromkeys(entry.reason for entry in entries))}; asked for by {', '.join(recipes)})"
             for recipes, entries in groups.items()]
    return f"Not available on this machine: {'; '.join(parts)}."


def _html_table(header: list[str], rows: list[list[str]], links: list[str | None] | None = None) -> str:
    head = "".join(f"<th>{html.escape(cell)}</th>" for cell in header)
    body = []
    for index, row in enumerate(rows):
        cells = [html.escape(cell) for cell in row]
        link = links[index] if links else None
        if link:
            cells[0] = f'<a href="{html.escape(link)}">{cells[0]}</a>'
        body.append("<tr>" + "".join(f"<td>{cell}</td>" for cell in cells) + "</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def _timeline_svg(timeline: list[TimelineRecord], seconds: float) -> str:
    """Bars of work items per worker (node/pid) over time; benchmarks in red."""
    lanes = list(dict.fromkeys(f"{r.node} pid {r.pid}" for r in timeline))
    if not lanes:
        return ""
    width, lane_height, label = 900, 18, 220
    scale = (width - label) / max(seconds, 1e-6)
    colors = {"build": "#4c78a8", "validate": "#72b7b2", "benchmark": "#e45756", "report": "#b8b8b8"}
    shapes = [f'<text x="0" y="{i * lane_height + 13}" font-size="11">{html.escape(lane)}</text>'
              for i, lane in enumerate(lanes)]
    for record in timeline:
        y = lanes.index(f"{record.node} pid {record.pid}") * lane_height + 2
        x = label + record.start * scale
        w = max((record.end - record.start) * scale, 1.0)
        tip = html.escape(f"{record.kind} {record.recipe} {record.start:.2f}-{record.end:.2f}s")
        shapes.append(f'<rect x="{x:.1f}" y="{y}" width="{w:.1f}" height="{lane_height - 4}" '
                      f'fill="{colors.get(record.kind, "#999")}"><title>{tip}</title></rect>')
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{len(lanes) * lane_height + 4}">'
            + "".join(shapes) + "</svg>")


def render_sweep_html(report: SweepReport | dict[str, Any]) -> str:
    report = SweepReport.of(report)
    counts = report.counts
    recipes = report.recipes
    links = [row.reports.get("html") or row.reports.get("md") or row.reports.get("json") for row in recipes]
    failures = "".join(f"<li>{html.escape(f.recipe)}{' / ' + html.escape(f.variant) if f.variant else ''}: "
                       f"{html.escape(str(f.reason))}</li>" for f in report.failures)
    style = ("body{font-family:sans-serif;margin:2em}table{border-collapse:collapse;margin-bottom:1.5em}"
             "td,th{border:1px solid #ccc;padding:3px 8px;font-size:13px}th{background:#eee}")
    return "\n".join([
        "<!DOCTYPE html>", f"<html><head><meta charset='utf-8'><title>qdeploy sweep {html.escape(report.sweep)}"
        f"</title><style>{style}</style></head><body>",
        f"<h1>qdeploy sweep: {html.escape(report.sweep)}</h1>",
        f"<p>{counts['recipes']} recipes: {counts['passed']} passed, {counts['failed']} failed, {counts['invalid']} "
        f"invalid, {counts['error']} errors; exit status {report.exit_code}; executor "
        f"{html.escape(report.executor.kind)}; {report.seconds:.1f} s.</p>",
        "<h2>Recipes</h2>", _html_table(RECIPE_HEADER, [_recipe_cells(r) for r in recipes], links),
        *(["<h2>What to ship</h2>", "<ul>" + "".join(f"<li>{html.escape(line)}</li>" for line in
                                                      _verdict_lines(report)) + "</ul>"]
          if report.verdicts else []),
        "<h2>Variants and targets</h2>", _html_table(MATRIX_HEADER, [_matrix_cells(r) for r in report.rows]),
        *([f"<p>{html.escape(line)}</p>"] if (line := _unavailable_line(report)) else []),
        *(["<h2>Failures</h2>", f"<ul>{failures}</ul>"] if failures else []),
        "<h2>Timeline</h2>", _timeline_svg(report.timeline, report.seconds),
        _html_table(TIMELINE_HEADER, [_timeline_cells(r) for r in report.timeline]),
        "</body></html>", ""])
