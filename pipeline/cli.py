"""The `qdeploy` command: run, check, schema, doctor.

Exit status: 0 when every gate holds, 1 when a gate or a stage fails, 2 for bad
input (recipe, model, data).  Errors a user caused print one clear message,
never a traceback (``--verbose`` shows tracebacks of qdeploy's own bugs).
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Quantization and precision deployment of ONNX models: one recipe, one report.")
log = logging.getLogger("qdeploy")
T = TypeVar("T")

Quiet = Annotated[bool, typer.Option("--quiet", "-q", help="Only errors; no progress display.")]
Verbose = Annotated[bool, typer.Option("--verbose", "-v", help="Log each step; tracebacks of internal errors.")]
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
    except Exception as exc:
        if verbose:
            raise
        typer.echo(f"internal error (a bug in qdeploy, please report it): {type(exc).__name__}: {exc}\n"
                   "run again with --verbose for the traceback", err=True)
        raise typer.Exit(1) from None


@app.command()
def run(
    recipe: RecipePath,
    out: Annotated[Path | None, typer.Option("--out", "-o", help="Output folder [default: runs/<name>/].")] = None,
    no_cache: Annotated[bool, typer.Option("--no-cache", help="Rebuild every artifact.")] = False,
    cache_dir: Annotated[Path | None, typer.Option("--cache-dir", help="Artifact cache [default: OUT/cache].")] = None,
    variant: Annotated[list[str] | None, typer.Option("--variant", help="Only this variant (repeatable).")] = None,
    target: Annotated[list[str] | None, typer.Option("--target", help="Only this target (repeatable).")] = None,
    quiet: Quiet = False,
    verbose: Verbose = False,
) -> None:
    """Run a recipe end to end and write report.json and report.md."""
    _setup_logging(quiet, verbose)

    def body() -> int:
        from pipeline.loader import load_recipe
        from pipeline.runner import RunOptions, run_recipe

        loaded = load_recipe(recipe)
        options = RunOptions(out_dir=out, cache_dir=cache_dir, use_cache=not no_cache, variants=variant,
                             targets=target, show_progress=not quiet and sys.stderr.isatty())
        result = run_recipe(loaded, options)
        if not quiet:
            _print_summary(result.report, result.out_dir)
        return result.exit_code

    raise typer.Exit(_guarded(body, verbose))


def _print_summary(report: dict[str, Any], out_dir: Path) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    table = Table(title=f"qdeploy: {report['recipe']['name']}")
    for column in ("variant", "target", "p50 ms", "speedup", "cosine", "validation", "benchmark"):
        table.add_column(column, no_wrap=True)
    checks = {(row["variant"], row["target"]): row for row in report["validation"]}
    for bench in report["benchmarks"]:
        check = checks.get((bench["variant"], bench["target"]), {})
        p50 = (bench.get("latency_ms") or {}).get("p50")
        cosine = (check.get("metrics") or {}).get("cosine")
        table.add_row(bench["variant"], bench["target"], f"{p50:.3f}" if p50 else "–",
                      f"{bench['speedup']:.2f}x" if bench.get("speedup") else "–",
                      f"{cosine:.6f}" if cosine is not None else "–", check.get("status", "–"), bench["status"])
    console.print(table)
    for gate in report["gates"]:
        mark = "[yellow]SKIP[/yellow]" if gate.get("skipped") else \
            "[green]PASS[/green]" if gate["passed"] else "[red]FAIL[/red]"
        console.print(f"{mark} gate {gate['variant']} on {gate['target']}: {gate['metric']} = {gate['value']} "
                      f"(min {gate['min']}, max {gate['max']}) {gate['reason']}")
    for failure in report["failures"]:
        console.print(f"[red]FAILED[/red] variant {failure['variant']} at stage {failure['stage']}: "
                      f"{failure['reason']}", markup=True)
    console.print(f"report: {out_dir / 'report.md'}")


@app.command()
def check(recipe: RecipePath, quiet: Quiet = False, verbose: Verbose = False) -> None:
    """Validate a recipe and print the plan; run nothing."""
    _setup_logging(quiet, verbose)

    def body() -> None:
        from pipeline.loader import load_recipe
        from pipeline.plan import describe_plan

        loaded = load_recipe(recipe)
        typer.echo(describe_plan(loaded))

    _guarded(body, verbose)


@app.command()
def schema() -> None:
    """Print the recipe's JSON Schema (for editors)."""
    from pipeline.plan import recipe_json_schema

    typer.echo(json.dumps(recipe_json_schema(), indent=2))


@app.command()
def doctor(as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False) -> None:
    """Library versions, available targets and CPU features of this machine."""
    from pipeline.envinfo import environment

    env = environment()
    if as_json:
        typer.echo(json.dumps(env, indent=2))
        return
    typer.echo(f"python {env['python']} on {env['platform']}")
    for name, version in env["versions"].items():
        typer.echo(f"  {name:22s} {version}")
    cpu = env["cpu"]
    typer.echo(f"cpu: {cpu['model']} ({cpu['cores']} cores)")
    typer.echo("  " + ", ".join(f"{flag}={'yes' if present else 'no'}" for flag, present in cpu["flags"].items()))
    typer.echo("targets:")
    for name, state in env["targets"].items():
        typer.echo(f"  {name:16s} {state}")


def main() -> None:
    app()


if __name__ == "__main__":
    main()
