"""The `qdeploy package` command: deployable packages of a finished run (qdeploy.pipeline.publish.package)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from qdeploy.core.userfiles import writable_folder

if TYPE_CHECKING:
    from qdeploy.core.report_parts import TargetVerdictRecord

__all__ = ["nothing_to_package", "package_command", "register_package_command"]


def package_command(
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

    Exit 2 when a published file (artifact, sidecar, recipe snapshot) differs from the sha256 report.json and
    artifacts/SHA256SUMS record, when report.json's tolerances are not the run's recipe's, when the target is
    not the run's or the variant did not pass validation there; exit 1 when a package fails its own check
    (nothing is written then).
    """
    # lazy: keeps `qdeploy --help` fast (pulls numpy, onnx, onnxruntime, pydantic, pydantic_core, yaml)
    from qdeploy.cli._common import guarded as _guarded
    from qdeploy.cli._common import setup_logging as _setup_logging

    _setup_logging(quiet, verbose)

    def body() -> None:
        # lazy: keeps `qdeploy --help` fast (pulls numpy, pydantic)
        from qdeploy.pipeline.publish.package import PackageError
        from qdeploy.pipeline.publish.package.publish import package_from_run

        why_not = None if variant else nothing_to_package(run, target)
        if why_not:
            raise PackageError(why_not, input_error=True)
        folders = package_from_run(run, target, variant, writable_folder(out, "--out folder"),
                                   ort_optimized=ort_optimized)
        if not quiet:
            for folder in folders:
                typer.echo(f"package: {folder}  (check: cd {folder} && python check.py)")

    _guarded(body, verbose)


def nothing_to_package(run: Path, target: str) -> str | None:
    """Why the run has nothing to package for ``target`` without --variant, naming each of its rows' status and
    reason there (docs/packages.md); None when it has something, or when its report.json cannot be read here:
    ``package_from_run`` then says what is wrong with it."""
    # lazy: keeps `qdeploy --help` fast (pulls pydantic)
    from pydantic import ValidationError

    from qdeploy.core.report import Report  # lazy: pydantic

    # lazy: keeps `qdeploy --help` fast (pulls numpy, pydantic)
    from qdeploy.pipeline.publish.package.publish import chosen_pairs

    try:
        report = Report.model_validate_json((run / "report.json" if run.is_dir() else run).read_bytes())
    except (OSError, ValueError, ValidationError):  # a report package_from_run refuses itself
        return None
    rows = [row for row in report.validation if row.target == target]
    if not rows or chosen_pairs(report, [target]):
        return None
    verdict = report.verdict.targets.get(target) if report.verdict else None
    ships = _verdict_note(verdict)
    return f"nothing to package for {target} in {run}: {ships}{_row_states(rows)}"


def _verdict_note(verdict: TargetVerdictRecord | None) -> str:
    if verdict is None or verdict.status == "ship":
        return ""
    why = verdict.why or "no reason recorded"
    return f"the verdict ships nothing there ({why}; --variant NAME packages a variant that passed); "


def _row_states(rows: list[Any]) -> str:
    """'fp32, fp16, int8 unavailable (target ort:cuda is not available here; ...)', one group per status+reason."""
    groups: dict[tuple[str, str], list[str]] = {}
    for row in rows:
        groups.setdefault((str(row.status), row.reason), []).append(row.variant)
    return "; ".join(f"{', '.join(variants)} {status}" + (f" ({reason})" if reason else "")
                     for (status, reason), variants in groups.items())


def register_package_command(app: typer.Typer) -> None:
    app.command(name="package", short_help="Package a run's artifact for a target (no qdeploy needed to load).")(
        package_command)
