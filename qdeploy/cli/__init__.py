"""The `qdeploy` command: run, compare, check, schema, doctor.

Exit status: 0 when every gate holds, 1 when a gate or a stage fails (or a native
library ends the run's process: ``qdeploy.cli.supervise`` says where), 2 for bad
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

from qdeploy.cli._common import guarded as _guarded
from qdeploy.cli._common import setup_logging as _setup_logging
from qdeploy.cli.explain import register_explain_command
from qdeploy.cli.package import register_package_command
from qdeploy.cli.supervise import enable_crash_stacks, supervised
from qdeploy.cli.sweep import register_sweep_command
from qdeploy.core.userfiles import writable_folder
from qdeploy.pipeline.results.tested_versions import difference_lines, tested_versions_record

__all__ = ["Quiet", "RecipePath", "Verbose", "check_command", "compare_command", "doctor_command", "main",
           "run_command", "schema_command"]

log = logging.getLogger("qdeploy")

# rich_markup_mode=None: plain click help, which never truncates option names and never eats "[default: ...]"
app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False, rich_markup_mode=None,
                  help="Quantization and precision deployment of ONNX models: one recipe, one report.")

Quiet = Annotated[bool, typer.Option("--quiet", "-q", help="Only errors; no progress display.", show_default="off")]
Verbose = Annotated[bool, typer.Option("--verbose", "-v", help="Log each step; tracebacks of internal errors.",
                                      show_default="off")]
RecipePath = Annotated[Path, typer.Argument(help="Recipe file (YAML).", show_default=False)]


@app.command(name="run", short_help="Run a recipe: build, validate, benchmark, report.")
def run_command(
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
    enable_crash_stacks()  # where `qdeploy` supervises this process (qdeploy.cli.supervise)

    def body() -> int:
        # lazy: keeps `qdeploy --help` fast (pulls numpy, onnx, onnxruntime, pydantic, pydantic_core, yaml)
        from qdeploy.api import run as run_recipe

        out_dir = writable_folder(out, "--out folder") if out else None
        cache = writable_folder(cache_dir, "--cache-dir folder") if cache_dir else None
        result = run_recipe(recipe, out=out_dir, cache_dir=cache, use_cache=not no_cache, variants=variant,
                            targets=target, progress=not quiet and sys.stderr.isatty())
        if not quiet:
            _print_summary(result.report, result.out_dir)
        return result.exit_code

    raise typer.Exit(_guarded(body, verbose))


def _print_summary(report: dict[str, Any], out_dir: Path) -> None:
    # lazy: keeps `qdeploy --help` fast (pulls numpy, onnx, onnxruntime, pydantic, pydantic_core, yaml)
    from qdeploy.cli.summary import print_summary

    print_summary(report, out_dir)  # its own module (qdeploy.cli.summary): the table, verdict, gates


@app.command(name="compare", short_help="What changed between two runs; exit 1 on a regression.")
def compare_command(
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
    """What changed from run A to run B; exit 1 on a regression, 2 on bad input.

    Without thresholds, latency and metric changes are shown, not judged.  A gate that passed in A and fails
    in B, a validation that passed and now fails, a variant that no longer builds, and a value A measured that
    B did not (missing, errored, NaN) are regressions whatever the thresholds.  A latency change within the
    noise either run measured is never one.  Runs of different models are refused; other differences (recipe,
    environment) are warned.  With -q, only the regressions are printed.
    """
    _setup_logging(quiet, verbose)

    def body() -> int:
        # lazy: keeps `qdeploy --help` fast (pulls numpy, pydantic)
        from qdeploy.pipeline.results.compare_runs import (
            Thresholds,
            compare_reports,
            format_comparison,
            format_regressions,
            load_report,
            parse_metric_drops,
        )

        thresholds = Thresholds(max_latency_regression, parse_metric_drops(max_metric_drop or []))
        comparison = compare_reports(load_report(run_a), load_report(run_b), thresholds,
                                     allow_mismatch=allow_mismatch)
        # the warnings are part of the comparison's text, never logged as well (they printed twice)
        if not quiet:
            typer.echo(format_comparison(comparison, str(run_a), str(run_b)))
        elif comparison.regressions:  # -q still says which rows regressed: a CI log must name them
            typer.echo(format_regressions(comparison, str(run_a), str(run_b)))
        return 1 if comparison.regressions else 0

    raise typer.Exit(_guarded(body, verbose))


@app.command(name="check", short_help="Validate a recipe (or sweep) and print the plan.")
def check_command(recipe: RecipePath, quiet: Quiet = False, verbose: Verbose = False) -> None:
    """Validate a recipe and its model's file and interface, and print the plan; run nothing."""
    _setup_logging(quiet, verbose)

    def body() -> None:
        # lazy: keeps `qdeploy --help` fast (pulls numpy, onnx, onnxruntime, pydantic, pydantic_core, yaml)
        from qdeploy.pipeline.recipe.loader import load_recipe_file

        # lazy: keeps `qdeploy --help` fast (pulls numpy, onnx, onnxruntime, pydantic, pydantic_core)
        from qdeploy.pipeline.recipe.preflight import check_before_run
        from qdeploy.pipeline.run.plan import describe_plan

        loaded = load_recipe_file(recipe)
        check_before_run(loaded)  # the model and the datasets, as the run would read them
        typer.echo(describe_plan(loaded))

    _guarded(body, verbose)


@app.command(name="schema")
def schema_command(report: Annotated[bool, typer.Option(
        "--report", help="The schema of report.json instead of the recipe's.", show_default="off")] = False) -> None:
    """Print the recipe's JSON Schema (for editors), or with --report that of report.json."""
    if report:
        from qdeploy.core.report import report_schema  # lazy: pydantic

        typer.echo(json.dumps(report_schema(), indent=2))
        return
    # lazy: keeps `qdeploy --help` fast (pulls numpy, onnx, onnxruntime, pydantic, pydantic_core, yaml)
    from qdeploy.pipeline.run.plan import recipe_json_schema

    typer.echo(json.dumps(recipe_json_schema(), indent=2))


@app.command(name="doctor", short_help="Versions, tested versions, targets and CPU features.")
def doctor_command(as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.",
                                                  show_default="off")] = False) -> None:
    """Library versions (and how they differ from the tested ones), available targets and CPU features."""

    def body() -> None:
        # lazy: keeps `qdeploy --help` fast (pulls numpy, pydantic)
        from qdeploy.pipeline.results.envinfo import environment

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

    _guarded(body, False)  # a closed or full stdout is a clean error, not a traceback


register_sweep_command(app)  # `qdeploy sweep`; `check` takes sweep files
register_package_command(app)  # `qdeploy package`
register_explain_command(app)  # `qdeploy explain`


def _version_callback(value: bool) -> None:
    if value:
        # lazy: keeps `qdeploy --help` fast (pulls numpy, onnx, onnxruntime, pydantic, pydantic_core, yaml)
        from qdeploy.cli.version import version_text

        typer.echo(version_text())
        raise typer.Exit(0)


@app.callback()
def _root(version: Annotated[bool, typer.Option(
        "--version", callback=_version_callback, is_eager=True,
        help="Print the versions of qdeploy, python and the runtimes, and exit.", show_default=False)] = False) -> None:
    """Quantization and precision deployment of ONNX models: one recipe, one report."""


def main() -> None:
    _keep_name_bytes(sys.stdout)
    status = supervised(sys.argv[1:])  # `qdeploy run` in a child, so that a native crash is reported
    if status is not None:
        sys.exit(status)
    app()


def _keep_name_bytes(stream: Any) -> None:
    """A path whose name is not UTF-8 (Python decodes its bytes as surrogates) reaches the terminal as its own
    bytes, as ``ls`` prints it: a strict stdout (a UTF-8 locale other than C.UTF-8) refused it, after the run."""
    if getattr(stream, "errors", None) == "strict" and callable(getattr(stream, "reconfigure", None)):
        stream.reconfigure(errors="surrogateescape")


if __name__ == "__main__":
    main()
