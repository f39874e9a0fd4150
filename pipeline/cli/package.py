"""The `qdeploy package` command: deployable packages of a finished run (qdeploy.pipeline.package)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

__all__ = ["package", "register"]


def package(
    run: Annotated[Path, typer.Argument(help="Output folder of a qdeploy run (or its report.json).",
                                        show_default=False, metavar="RUN")],
    target: Annotated[str, typer.Option("--target", "-t", help="Target to package for, e.g. openvino:cpu.",
                                        show_default=False, metavar="TARGET")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Folder that receives <runtime-device>-<variant>/.",
                                      show_default=False, metavar="DIR")],
    variant: Annotated[list[str] | None, typer.Option(
        "--variant", help="Package this variant (repeatable).", metavar="VARIANT",
        show_default="the verdict's pick, else every variant that passed on TARGET")] = None,
    ort_optimized: Annotated[bool, typer.Option(
        "--ort-optimized", help="ort:* only: also add an ORT_ENABLE_EXTENDED-optimized model (kept when it passes "
        "the check).", show_default="off")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="Only errors.", show_default="off")] = False,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Log each step; tracebacks of internal errors.",
                                          show_default="off")] = False,
) -> None:
    """Write a package that production code loads without qdeploy, for TARGET, from a finished run.

    Exit 2 when the run's artifacts changed since it (artifacts/SHA256SUMS), the target is not the run's or the
    variant did not pass validation there; exit 1 when a package fails its own check (nothing is written then).
    """
    from qdeploy.pipeline.cli._common import guarded as _guarded
    from qdeploy.pipeline.cli._common import setup_logging as _setup_logging

    _setup_logging(quiet, verbose)

    def body() -> None:
        from qdeploy.core.userfiles import writable_folder
        from qdeploy.pipeline.package.publish import package_from_run

        folders = package_from_run(run, target, variant, writable_folder(out, "--out folder"),
                                   ort_optimized=ort_optimized)
        if not quiet:
            for folder in folders:
                typer.echo(f"package: {folder}  (check: cd {folder} && python check.py)")

    _guarded(body, verbose)


def register(app: typer.Typer) -> None:
    app.command(name="package", short_help="Package a run's artifact for a target (no qdeploy needed to load).")(
        package)
