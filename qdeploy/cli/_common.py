"""What every qdeploy command shares: logging on stderr, and one place that turns errors into exit statuses."""

from __future__ import annotations

import errno
import logging
import sys
from collections.abc import Callable
from typing import TypeVar

import typer

from qdeploy.core.errors import QdeployError, UserFileError
from qdeploy.core.userfiles import USER_ERRNOS, os_error_problem

__all__ = ["guarded", "setup_logging"]

log = logging.getLogger("qdeploy")
T = TypeVar("T")


def setup_logging(quiet: bool, verbose: bool) -> None:
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
    for name in ("qdeploy",):
        logging.getLogger(name).setLevel(level)
    _quiet_onnxruntime(verbose)


def _quiet_onnxruntime(verbose: bool) -> None:
    """ONNX Runtime's own log lines (warnings of an old opset or a skipped transpose optimizer, and an error line
    for every kernel that fails) straight to stderr only with --verbose.  A failing run also raises, and qdeploy
    reports it once, naming the stage, variant and node: caustic-nmr's run on random indices printed 15 red
    "[E:onnxruntime:...] Gather ... out of data bounds" lines beside qdeploy's own three messages.  Sessions qdeploy
    does not create itself (ORT's quantizer's) log at this process default too."""
    try:
        import onnxruntime
    except ImportError:
        return
    onnxruntime.set_default_logger_severity(ORT_WARNING if verbose else ORT_FATAL)


ORT_WARNING, ORT_FATAL = 2, 4
"""ONNX Runtime's logger severities."""


def guarded(action: Callable[[], T], verbose: bool) -> T:
    """Run a command body; QdeployErrors become a message and their exit status."""
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
    return exc.errno in USER_ERRNOS and exc.filename is not None


def _user_path_error(exc: OSError) -> Exception:
    return UserFileError("path", exc.filename, os_error_problem(exc))
