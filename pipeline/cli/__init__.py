"""The `qdeploy` command: run, compare, check, schema, doctor.

Exit status: 0 when every gate holds, 1 when a gate or a stage fails, 2 for bad
input (recipe, model, data).  Errors a user caused print one clear message,
never a traceback (``--verbose`` shows tracebacks of qdeploy's own bugs).
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from qdeploy.pipeline.cli._common import guarded as _guarded
from qdeploy.pipeline.cli._common import setup_logging as _setup_logging
from qdeploy.pipeline.cli.package import register as _register_package
from qdeploy.pipeline.cli.sweep import register as _register_sweep

__all__ = ["Quiet", "RecipePath", "Verbose", "check", "compare", "doctor", "main", "run", "schema"]

log = logging.getLogger("qdeploy")

# rich_markup_mode=None: plain click help, which never truncates option names and never eats "[default: ...]"
app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False, rich_markup_mode=None,
                  help="Quantization and precision deployment of ONNX models: one recipe, one report.")

Quiet = Annotated[bool, typer.Option("--quiet", "-q", help="Only errors; no progress display.", show_default="off")]
Verbose = Annotated[bool, typer.Option("--verbose", "-v", help="Log each step; tracebacks of internal errors.",
                                      show_default="off")]
RecipePath = Annotated[Path, typer.Argument(help="Recipe file (YAML).", show_default=False)]


@app.command(short_help="Run a recipe: build, validate, benchmark, report.")
def run(
    recipe: RecipePath,
    out: Annotated[Path | None, typer.Option("--out", "-o", help="Output folder.", show_default="runs/<name>/",
                                             metavar="DIR")] = None,
    no_cache: Annotated[bool, typer.Option("--no-cache", help="Rebuild every artifact.", show_default="off")] = False,
    cache_dir: Annotated[Path | None, typer.Option("--cache-dir", help="Artifact cache.", show_default="OUT/cache",
                                                   metavar="DIR")] = None,
    variant: Annotated[list[str] | None, typer.Option(
        "--variant", help="Only this variant (repeatable).", show_default="every variant", metavar="VARIANT")] = None,
    target: Annotated[list[str] | None, typer.Option(
        "--target", help="Only this target (repeatable).", show_default="every target", metavar="TARGET")] = None,
    quiet: Quiet = False,
    verbose: Verbose = False,
) -> None:
    """Run a recipe end to end and write report.json, report.md and report.html."""
    _setup_logging(quiet, verbose)

    def body() -> int:
        from qdeploy.api import run as run_recipe
        from qdeploy.core.userfiles import writable_folder

        out_dir = writable_folder(out, "--out folder") if out else None
        cache = writable_folder(cache_dir, "--cache-dir folder") if cache_dir else None
        result = run_recipe(recipe, out=out_dir, cache_dir=cache, use_cache=not no_cache, variants=variant,
                            targets=target, progress=not quiet and sys.stderr.isatty())
        if not quiet:
            _print_summary(result.report, result.out_dir)
        return result.exit_code

    raise typer.Exit(_guarded(body, verbose))


PLAIN_WIDTH = 220
"""Columns of the summary when stdout is no terminal (a CI log): wide enough that no row folds."""


def _print_summary(report: dict[str, Any], out_dir: Path) -> None:
    from rich import box
    from rich.console import Console
    from rich.table import Table

    from qdeploy.core.rows import ThroughputRow
    from qdeploy.pipeline.report.format import fmt_number, fmt_speedup
    from qdeploy.pipeline.report.precision import speedup_sides
    from qdeploy.pipeline.report.verdict import verdict_lines
    from qdeploy.pipeline.report.view import (
        fmt,
        gate_label,
        gate_verdict,
        matrix,
        unavailable_line,
        unavailable_targets,
    )

    console = Console()
    if not console.is_terminal:  # CI logs: rows on one line each, never numbers folded at 80 columns
        console = Console(width=max(console.width, PLAIN_WIDTH))
    missing = unavailable_targets(report)
    rows = [row for row in matrix(report) if row.target not in missing]
    batches = len({row.batch for row in rows if row.batch is not None}) > 1
    table = Table(title=f"qdeploy: {report['recipe']['name']}", box=box.SIMPLE_HEAD)
    columns = ("variant", "target", "precision ran", *(("batch",) if batches else ()), "p50 ms", "speedup",
               "cosine", "SNR dB", "status")
    for column in columns:
        table.add_column(column, no_wrap=column in ("variant", "target", "status"), overflow="fold")
    for row in rows:
        p50 = fmt(row.latency.get("p50")) + ("*" if row.bench.get("noisy") else "")
        sides = speedup_sides(report, row.bench)
        speed = fmt_speedup(row.speedup, row.bench.get("speedup_range")) + (f": {sides}" if sides else "")
        cells = [row.variant, row.target, row.precision_ran, *((fmt(row.batch),) if batches else ()), p50, speed,
                 fmt(row.metrics.get("cosine"), 6), fmt(row.metrics.get("snr_db"), 4), row.status]
        table.add_row(*cells, style="dim" if row.status == "unavailable" else None)
    console.print(table)
    if any(row.bench.get("noisy") for row in rows):
        console.print("* noisy: the 95% interval of the median is wider than 10% of it", highlight=False)
    if missing:
        console.print(unavailable_line(missing), style="dim", highlight=False)
    shown = [row for row in map(ThroughputRow.from_json, report.get("throughput") or []) if row.target not in missing]
    if shown:
        rates = Table(title="throughput (p50: latency at that load)", box=box.SIMPLE_HEAD)
        for column in ("variant", "target", "inf/s", "vs ref", "in flight", "p50 ms", "status"):
            rates.add_column(column, no_wrap=column in ("variant", "target"), overflow="fold")
        for row in shown:
            rates.add_row(row.variant, row.target, fmt_number(row.inferences_per_s),
                          fmt_speedup(row.speedup, row.speedup_range), fmt_number(row.requests_in_flight),
                          fmt_number(row.latency_ms.p50 if row.latency_ms else None), row.status)
        console.print(rates)
    for headline, details in verdict_lines(report.get("verdict")):
        if not headline.startswith("Not available"):
            console.print(headline, highlight=False)
            for detail in details[:1]:  # the runner-up or the first reason; the rest is in report.md
                console.print(f"  {detail}", style="dim", highlight=False)
    styles = {"PASS": "[green]PASS[/green]", "FAIL": "[red]FAIL[/red]", "SKIP": "[yellow]SKIP[/yellow]"}
    for gate in report["gates"]:
        reason = f" {gate['reason']}" if gate.get("reason") else ""
        console.print(f"{styles[gate_verdict(gate)]} gate {gate_label(gate)}: {fmt(gate['value'], 4)}{reason}",
                      markup=True, highlight=False)
    for failure in report["failures"]:
        console.print(f"[red]FAILED[/red] variant {failure['variant']} at stage {failure['stage']}: "
                      f"{failure['reason']}", markup=True)
    packages = report.get("packages") or {}
    for failed in packages.get("failed", []):
        console.print(f"[yellow]no package[/yellow] for {failed['variant']} on {failed['target']}: {failed['reason']}",
                      markup=True, highlight=False)
    if packages.get("written"):
        console.print(f"packages: {len(packages['written'])} in {out_dir / 'packages'} (docs/packages.md)",
                      highlight=False)
    written = [name for name in ("report.html", "report.md", "report.json") if (out_dir / name).is_file()]
    console.print(f"report: {', '.join(str(out_dir / name) for name in written)}", highlight=False)


@app.command(short_help="What changed between two runs; exit 1 on a regression.")
def compare(
    run_a: Annotated[Path, typer.Argument(help="Earlier run: its folder or its report.json.", show_default=False)],
    run_b: Annotated[Path, typer.Argument(help="Later run: its folder or its report.json.", show_default=False)],
    max_latency_regression: Annotated[float | None, typer.Option(
        "--max-latency-regression", min=0.0, metavar="SHARE", show_default="no limit",
        help="Fail when a median latency of B exceeds A's by more than this share (0.1 = 10%).")] = None,
    max_metric_drop: Annotated[list[str] | None, typer.Option(
        "--max-metric-drop", metavar="METRIC=VALUE", show_default="no limit",
        help="Fail when a fidelity metric gets worse by more than VALUE (e.g. cosine=0.001, snr_db=3); "
        "repeatable.")] = None,
    allow_mismatch: Annotated[bool, typer.Option(
        "--allow-mismatch", help="Compare runs of different models (inputs/outputs differ) or with no row in "
        "common instead of refusing (exit 2).", show_default="off")] = False,
    quiet: Quiet = False,
    verbose: Verbose = False,
) -> None:
    """What changed from run A to run B; exit 1 on a regression beyond the thresholds, 2 on bad input.

    A gate that passed in A and fails in B, a validation that passed and now fails, a variant that no
    longer builds, and a value A measured that B did not (missing, errored, NaN) are regressions whatever the
    thresholds.  Runs of different models are refused; other differences (recipe, environment) are warned.
    """
    _setup_logging(quiet, verbose)

    def body() -> int:
        from qdeploy.pipeline.compare_runs import (
            Thresholds,
            compare_reports,
            format_comparison,
            load_report,
            parse_metric_drops,
        )

        thresholds = Thresholds(max_latency_regression, parse_metric_drops(max_metric_drop or []))
        comparison = compare_reports(load_report(run_a), load_report(run_b), thresholds,
                                     allow_mismatch=allow_mismatch)
        for warning in comparison.warnings:
            log.warning("compare: %s", warning)
        if not quiet:
            typer.echo(format_comparison(comparison, str(run_a), str(run_b)))
        return 1 if comparison.regressions else 0

    raise typer.Exit(_guarded(body, verbose))


@app.command(short_help="Validate a recipe (or sweep) and print the plan.")
def check(recipe: RecipePath, quiet: Quiet = False, verbose: Verbose = False) -> None:
    """Validate a recipe and its model's file and interface, and print the plan; run nothing."""
    _setup_logging(quiet, verbose)

    def body() -> None:
        from qdeploy.pipeline.loader import load_recipe
        from qdeploy.pipeline.plan import describe_plan
        from qdeploy.stages.export import inspect_source

        loaded = load_recipe(recipe)
        inspect_source(loaded.model, loaded.resolve)
        typer.echo(describe_plan(loaded))

    _guarded(body, verbose)


@app.command()
def schema() -> None:
    """Print the recipe's JSON Schema (for editors)."""
    from qdeploy.pipeline.plan import recipe_json_schema

    typer.echo(json.dumps(recipe_json_schema(), indent=2))


@app.command(short_help="Versions, tested versions, targets and CPU features.")
def doctor(as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.",
                                                  show_default="off")] = False) -> None:
    """Library versions (and how they differ from the tested ones), available targets and CPU features."""
    from qdeploy.pipeline.envinfo import environment
    from qdeploy.pipeline.tested_versions import difference_lines, tested_versions_record

    env = environment()
    if as_json:
        tested = {**env["tested_versions"], "runtimes": tested_versions_record()}
        typer.echo(json.dumps({**env, "tested_versions": tested}, indent=2))
        return
    typer.echo(f"python {env['python']} on {env['platform']}")
    for name, version in env["versions"].items():
        typer.echo(f"  {name:22s} {version}")
    for line in difference_lines():
        typer.echo(line)
    cpu = env["cpu"]
    typer.echo(f"cpu: {cpu['model']} ({cpu['cores']} cores)")
    typer.echo("  " + ", ".join(f"{flag}={'yes' if present else 'no'}" for flag, present in cpu["flags"].items()))
    int8 = env["int8_path"]
    source = "" if int8["flags_source"] == "/proc/cpuinfo" else f" [flags from {int8['flags_source']}]"
    typer.echo(f"int8 path: {int8['kind']}{source}: {int8['meaning']}")
    for name, line in int8["targets"].items():
        typer.echo(f"  {name:16s} {line}")
    typer.echo("targets:")
    for name, state in env["targets"].items():
        typer.echo(f"  {name:16s} {state}")


_register_sweep(app)  # `qdeploy sweep`; `check` takes sweep files
_register_package(app)  # `qdeploy package`


def _version_callback(value: bool) -> None:
    if value:
        from qdeploy.pipeline.cli.version import version_text

        typer.echo(version_text())
        raise typer.Exit(0)


@app.callback()
def _root(version: Annotated[bool, typer.Option(
        "--version", callback=_version_callback, is_eager=True,
        help="Print the versions of qdeploy, python and the runtimes, and exit.", show_default=False)] = False) -> None:
    """Quantization and precision deployment of ONNX models: one recipe, one report."""


def main() -> None:
    app()


if __name__ == "__main__":
    main()
