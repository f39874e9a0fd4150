"""The `qdeploy explain` command: where the time and the error come from, layer by layer, in a finished run."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

__all__ = ["explain_command", "register_explain_command"]


def explain_command(
    run: Annotated[Path, typer.Argument(help="Output folder of a qdeploy run (or its report.json).",
                                        show_default=False, metavar="RUN")],
    variant: Annotated[str | None, typer.Option("--variant", help="Only this variant.", metavar="VARIANT",
                                                show_default="every profiled variant")] = None,
    target: Annotated[str | None, typer.Option("--target", "-t", help="Only this target.", metavar="TARGET",
                                               show_default="every profiled target")] = None,
    top: Annotated[int, typer.Option("--top", "-n", help="Layers shown by time and by error.", metavar="N")] = 10,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Tracebacks of internal errors.",
                                          show_default="off")] = False,
) -> None:
    """Per profiled (variant, target) of RUN: the share of MACs and time per precision that ran, why compute
    layers ran in float, and the layers that cost most time and add most error (the report's layers section)."""
    # lazy: keeps `qdeploy --help` fast (pulls numpy, onnx, pydantic)
    from qdeploy.cli._common import guarded

    def body() -> None:
        # lazy: keeps `qdeploy --help` fast (pulls numpy, onnx, onnxruntime, pydantic)
        from qdeploy.api import explain

        typer.echo(explain(run, variant=variant, target=target, top=top))

    guarded(body, verbose)


def register_explain_command(app: typer.Typer) -> None:
    app.command(name="explain", short_help="Where the time and the error come from, layer by layer.")(explain_command)
