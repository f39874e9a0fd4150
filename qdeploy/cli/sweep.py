"""The `qdeploy sweep` command, the sweep side of `qdeploy check`, and the sweep's progress display.

``register_sweep_command(app)`` adds both to the CLI of ``qdeploy.cli``: the sweep command, and a ``check``
that prints the expanded plan when it is given a sweep file (any other file goes to the recipe check unchanged).
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Annotated, Any

import typer

from qdeploy.core.userfiles import writable_folder

if TYPE_CHECKING:
    from qdeploy.pipeline.sweep.executors import Job
    from qdeploy.pipeline.sweep.work import WorkItem

__all__ = ["ExecutorOption", "SweepProgress", "check_sweep", "describe_progress", "register_sweep_command",
           "sweep_command"]

ExecutorOption = Annotated[str, typer.Option("--executor", "-e", help="Where work runs: local (this machine) or ray.",
                                             metavar="local|ray")]


def sweep_command(
    paths: Annotated[list[Path], typer.Argument(help="Recipe files and/or sweep files (YAML).", show_default=False)],
    out: Annotated[Path | None, typer.Option("--out", "-o", help="Sweep folder.", show_default="runs/<sweep name>/",
                                             metavar="DIR")] = None,
    executor: ExecutorOption = "local",
    address: Annotated[str | None, typer.Option(
        "--address", help="Ray cluster: 'auto' (this node's cluster) or ray://HEAD:10001.",
        show_default="none: start Ray here", metavar="ADDRESS")
    ] = None,
    workers: Annotated[int | None, typer.Option(
        "--workers", "-j", min=1, help="Local executor: parallel builds and validations.",
        show_default="the cores", metavar="N")
    ] = None,
    cache_dir: Annotated[Path | None, typer.Option(
        "--cache-dir", help="Artifact cache shared by every recipe.", show_default="OUT/cache",
        metavar="DIR")] = None,
    no_cache: Annotated[bool, typer.Option("--no-cache", help="Rebuild every artifact.", show_default="off")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="Only errors; no progress display.",
                                        show_default="off")] = False,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Log each step; tracebacks of internal errors.",
                                      show_default="off")
                       ] = False,
) -> None:
    """Run many recipes as one sweep and write sweep.json, sweep.md and sweep.html (exit 2: a recipe is invalid)."""
    # lazy: keeps `qdeploy --help` fast (pulls numpy, onnx, onnxruntime, pydantic, pydantic_core, yaml)
    from qdeploy.cli._common import guarded, setup_logging

    setup_logging(quiet, verbose)
    if executor not in ("local", "ray"):
        typer.echo(f"error: --executor {executor}: choose local or ray", err=True)
        raise typer.Exit(2)

    def body() -> int:
        # lazy: keeps `qdeploy --help` fast (pulls numpy, onnx, onnxruntime, pydantic, pydantic_core, yaml)
        from qdeploy.pipeline.sweep import load_sweep
        from qdeploy.pipeline.sweep.executors import SweepOptions, run_sweep

        plan = load_sweep(paths)
        out_dir = writable_folder(out or Path("runs") / plan.name, "--out folder")
        cache = writable_folder(cache_dir, "--cache-dir folder") if cache_dir else None
        options = SweepOptions(out_dir=out_dir, cache_dir=cache, use_cache=not no_cache,
                               executor=executor, workers=workers, address=address)  # type: ignore[arg-type]
        with SweepProgress(len(plan.entries), enabled=not quiet and sys.stderr.isatty()) as progress:
            result = run_sweep(plan, options, on_change=progress.update)
        if not quiet:
            _print_summary(result.report, result.out_dir)
        return result.exit_code

    raise typer.Exit(guarded(body, verbose))


def _print_summary(report: dict[str, Any], out_dir: Path) -> None:
    from rich.console import Console
    from rich.table import Table

    from qdeploy.pipeline.sweep.report_model import SweepReport  # lazy: pydantic

    sweep = SweepReport.of(report)
    console = Console()
    table = Table(title=f"qdeploy sweep: {sweep.sweep}")
    for column in ("recipe", "status", "gates", "seconds", "reason"):
        table.add_column(column, overflow="fold")
    colors = {"passed": "green", "failed": "red", "invalid": "red", "error": "red"}
    for row in sweep.recipes:
        status = f"[{colors.get(row.status, 'white')}]{row.status}[/]"
        gates = f"{row.gates.passed} passed, {row.gates.failed} failed"
        seconds = f"{row.seconds:.1f}" if row.seconds is not None else "–"
        table.add_row(row.name, status, gates, seconds, row.reason or "")
    console.print(table)
    console.print(f"sweep report: {out_dir / 'sweep.md'} (and sweep.html, sweep.json)")


def check_sweep(path: Path) -> int:
    """Print the expanded plan of a sweep file; 2 when any of its recipes is invalid (as loaded, or as `check` finds a
    recipe's model and datasets)."""
    # lazy: keeps `qdeploy --help` fast (pulls numpy, onnx, onnxruntime, pydantic, pydantic_core, yaml)
    from qdeploy.pipeline.sweep import check_entries, describe_sweep, load_sweep

    plan = load_sweep([path])
    check_entries(plan)
    typer.echo(describe_sweep(plan))
    return 2 if plan.invalid else 0


def register_sweep_command(app: typer.Typer) -> None:
    """Add `sweep` to the CLI and let `check` take sweep files as well as recipes."""
    app.command(name="sweep", short_help="Run many recipes as one sweep (locally or on Ray).")(sweep_command)
    for info in app.registered_commands:
        if info.callback is not None and (info.name or info.callback.__name__) == "check":
            info.callback = _check_accepting_sweeps(info.callback)


def _check_accepting_sweeps(recipe_check: Any) -> Any:
    """The recipe check, with its own signature and options, sending sweep files to `check_sweep` first."""

    @functools.wraps(recipe_check)
    def check(*args: Any, **kwargs: Any) -> Any:
        # lazy: keeps `qdeploy --help` fast (pulls numpy, onnx, onnxruntime, pydantic, pydantic_core, yaml)
        from qdeploy.cli._common import guarded, setup_logging
        from qdeploy.pipeline.sweep import is_sweep_file

        path = kwargs.get("recipe", args[0] if args else None)
        if path is None or not is_sweep_file(Path(path)):
            return recipe_check(*args, **kwargs)
        verbose = bool(kwargs.get("verbose", False))
        setup_logging(bool(kwargs.get("quiet", False)), verbose)
        raise typer.Exit(guarded(lambda: check_sweep(Path(path)), verbose))

    return check


class SweepProgress:
    """One line over the whole sweep: recipes done, running and failed, and the work in hand."""

    def __init__(self, total: int, *, enabled: bool = True) -> None:
        self._total = total
        self._enabled = enabled
        self._progress: Any = None
        self._task: Any = None

    def __enter__(self) -> SweepProgress:
        if self._enabled:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self._progress = Progress(TextColumn("[bold]sweep"), BarColumn(), MofNCompleteColumn(),
                                      TimeElapsedColumn(), TextColumn("{task.description}"),
                                      console=Console(stderr=True), transient=False)
            self._progress.__enter__()
            self._task = self._progress.add_task("starting", total=self._total)
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        if self._progress is not None:
            self._progress.__exit__(kind, error, trace)

    def update(self, jobs: list[Job], running: list[WorkItem]) -> None:
        if self._progress is None:
            return
        self._progress.update(self._task, completed=sum(job.finished for job in jobs),
                              description=describe_progress(jobs, running))


def describe_progress(jobs: list[Job], running: list[WorkItem]) -> str:
    """'3 done · 2 running · 1 failed · now: benchmark a, build b'."""
    done = sum(job.finished for job in jobs)
    failed = sum(job.status in ("failed", "invalid", "error") for job in jobs)
    active = sum(job.status == "running" for job in jobs)
    now = ", ".join(f"{item.kind} {item.recipe}" for item in running[:3]) + (" …" if len(running) > 3 else "")
    return f"{done} done · {active} running · {failed} failed" + (f" · now: {now}" if now else "")
