"""The `qdeploy` command: run, compare, check, schema, doctor.

Exit status: 0 when every gate holds, 1 when a gate or a stage fails, 2 for bad
input (recipe, model, data).  Errors a user caused print one clear message,
never a traceback (``--verbose`` shows tracebacks of qdeploy's own bugs).
"""

from __future__ import annotations

import errno
import json
import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer

# rich_markup_mode=None: plain click help, which never truncates option names and never eats "[default: ...]"
app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False, rich_markup_mode=None,
                  help="Quantization and precision deployment of ONNX models: one recipe, one report.")
log = logging.getLogger("qdeploy")
T = TypeVar("T")

Quiet = Annotated[bool, typer.Option("--quiet", "-q", help="Only errors; no progress display.", show_default="off")]
Verbose = Annotated[bool, typer.Option("--verbose", "-v", help="Log each step; tracebacks of internal errors.",
                                      show_default="off")]
RecipePath = Annotated[Path, typer.Argument(help="Recipe file (YAML).", show_default=False)]


def _setup_logging(quiet: bool, verbose: bool) -> None:
    """Logs go to stderr: rich on a terminal, plain unwrapped lines in CI logs and pipes."""
    level = logging.ERROR if quiet else logging.DEBUG if verbose else logging.WARNING
    handler: logging.Handler
    if sys.stderr.isatty():
        from rich.console import Console
        from rich.logging import RichHandler

        handler = RichHandler(console=Console(stderr=True), show_path=verbose, show_time=verbose,
                              rich_tracebacks=verbose, markup=False)
        handler.setFormatter(logging.Formatter("%(message)s"))
    else:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=logging.WARNING, handlers=[handler], force=True)
    for name in ("qdeploy", "pipeline", "stages", "calibration"):
        logging.getLogger(name).setLevel(level)


def _guarded(action: Callable[[], T], verbose: bool) -> T:
    """Run a command body; QdeployErrors become a message and their exit status."""
    from pipeline.errors import QdeployError

    try:
        return action()
    except QdeployError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(exc.exit_code) from None
    except KeyboardInterrupt:
        typer.echo("interrupted; complete artifacts stay in the cache and the next run resumes from them", err=True)
        raise typer.Exit(130) from None
    except OSError as exc:
        if _on_a_user_path(exc):  # a path the user gave, wrong in a way they can fix: exit 2, not a bug
            log.debug("OS error on a user's path", exc_info=True)
            typer.echo(f"error: {_user_path_error(exc)}", err=True)
            raise typer.Exit(2) from None
        if verbose:
            raise
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            typer.echo(f"error: no space left on the device ({exc.filename or 'while writing'}); free some space "
                       "and run again: complete artifacts stay in the cache", err=True)
        else:
            _internal_error(exc)
        raise typer.Exit(1) from None
    except Exception as exc:
        if verbose:
            raise
        _internal_error(exc)
        raise typer.Exit(1) from None


def _internal_error(exc: Exception) -> None:
    typer.echo(f"internal error (a bug in qdeploy, please report it): {type(exc).__name__}: {exc}\n"
               "run again with --verbose for the traceback", err=True)


def _on_a_user_path(exc: OSError) -> bool:
    from pipeline.userfiles import USER_ERRNOS

    return exc.errno in USER_ERRNOS and exc.filename is not None


def _user_path_error(exc: OSError) -> Exception:
    from pipeline.errors import UserFileError
    from pipeline.userfiles import os_error_problem

    return UserFileError("path", exc.filename, os_error_problem(exc))


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
        from pipeline.loader import load_recipe
        from pipeline.runner import RunOptions, default_out_dir, run_recipe
        from pipeline.userfiles import writable_folder

        loaded = load_recipe(recipe)
        out_dir = writable_folder(out or default_out_dir(loaded), "--out folder")
        cache = writable_folder(cache_dir, "--cache-dir folder") if cache_dir else None
        options = RunOptions(out_dir=out_dir, cache_dir=cache, use_cache=not no_cache, variants=variant,
                             targets=target, show_progress=not quiet and sys.stderr.isatty())
        result = run_recipe(loaded, options)
        if not quiet:
            _print_summary(result.report, result.out_dir)
        return result.exit_code

    raise typer.Exit(_guarded(body, verbose))


def _print_summary(report: dict[str, Any], out_dir: Path) -> None:
    from rich import box
    from rich.console import Console
    from rich.table import Table

    from pipeline.report_view import fmt, gate_label, gate_verdict, matrix

    console = Console()
    rows = matrix(report)
    batches = len({row.batch for row in rows if row.batch is not None}) > 1
    table = Table(title=f"qdeploy: {report['recipe']['name']}", box=box.SIMPLE_HEAD)
    columns = ("variant", "target", *(("batch",) if batches else ()), "p50 ms", "speedup", "cosine", "SNR dB",
               "status")
    for column in columns:
        table.add_column(column, no_wrap=column in ("variant", "target", "status"), overflow="fold")
    for row in rows:
        p50 = fmt(row.latency.get("p50")) + ("*" if row.bench.get("noisy") else "")
        speed = f"{row.speedup:.2f}x" + (" ≈" if row.speedup_undecided else "") if row.speedup else "–"
        cells = [row.variant, row.target, *((fmt(row.batch),) if batches else ()), p50, speed,
                 fmt(row.metrics.get("cosine"), 6), fmt(row.metrics.get("snr_db"), 4), row.status]
        table.add_row(*cells, style="dim" if row.status == "unavailable" else None)
    console.print(table)
    if any(row.bench.get("noisy") for row in rows):
        console.print("* noisy: the 95% interval of the median is wider than 10% of it", highlight=False)
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
        from pipeline.compare_runs import (
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
        from pipeline.loader import load_recipe
        from pipeline.plan import describe_plan
        from stages.export import inspect_source

        loaded = load_recipe(recipe)
        inspect_source(loaded.model, loaded.resolve)
        typer.echo(describe_plan(loaded))

    _guarded(body, verbose)


@app.command()
def schema() -> None:
    """Print the recipe's JSON Schema (for editors)."""
    from pipeline.plan import recipe_json_schema

    typer.echo(json.dumps(recipe_json_schema(), indent=2))


@app.command(short_help="Versions, tested versions, targets and CPU features.")
def doctor(as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.",
                                                  show_default="off")] = False) -> None:
    """Library versions (and how they differ from the tested ones), available targets and CPU features."""
    from pipeline.envinfo import environment
    from pipeline.tested_versions import difference_lines, tested_versions_record

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


__import__("pipeline.cli_sweep", fromlist=["register"]).register(app)  # `qdeploy sweep`; `check` takes sweep files
__import__("pipeline.cli_package", fromlist=["register"]).register(app)  # `qdeploy package`


def _version_callback(value: bool) -> None:
    if value:
        from pipeline.cli_version import version_text

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
