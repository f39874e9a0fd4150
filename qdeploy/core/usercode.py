"""The Python a recipe names (``model.torch.factory``, ``validate.metric``, a budget's ``tolerance.metric``):
code execution, on purpose, and every call of it goes through ``call_user``.

User code can fail in ways an ``except Exception`` does not see, and in ways no exception says: it may call
``sys.exit(3)`` (``SystemExit``), raise ``KeyboardInterrupt``, or never return.  Unguarded, the first two ended
qdeploy with the user's exit status, no message and no report, and the last hung ``qdeploy run`` forever.
``call_user`` runs the code in a daemon worker thread and waits for it, at most ``seconds`` when given:

- its result, or an ordinary exception it raised, comes back as if it had been called directly (each caller
  keeps its own handling of a metric that raises);
- ``SystemExit``, ``KeyboardInterrupt`` or any other ``BaseException`` raised by the code becomes a
  ``UserCodeError`` naming it ("task metric metrics.py:fn called sys.exit(3)");
- past ``seconds``, a ``UserCodeError`` says it "did not return within N s".

Why a thread: only a thread tells the user's ``raise KeyboardInterrupt`` apart from the user pressing Ctrl-C
(signals reach the main thread, which is waiting here: a real Ctrl-C still stops qdeploy); and a call in a thread
shares the caller's memory, where a subprocess would pickle every output array of every call and would need the
user's function to be picklable.  The price: Python cannot kill a thread, so a call that never returns goes on
running until the process ends.  The thread is a daemon, so it never holds the process open at exit (a
``concurrent.futures`` pool would: its threads are joined at exit); and a ``UserFunction`` that timed out once
is never called again (its next call fails at once with the same reason), so a stuck metric costs one deadline,
not one per evaluation.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from qdeploy.core.errors import QdeployInputError

__all__ = ["DEFAULT_METRIC_SECONDS", "UserCodeError", "UserCodeTimeout", "UserFunction", "call_user",
           "import_user_module"]

DEFAULT_METRIC_SECONDS = 300.0
"""How long one call of a task metric may take (``metric_timeout_seconds`` in the recipe changes it): minutes for
an honest metric over thousands of samples, and a hung one ends the stage within five."""
_POLL_SECONDS = 0.25
"""How often the waiting thread wakes (a real Ctrl-C is handled between waits)."""


class UserCodeError(QdeployInputError):
    """The recipe's own Python failed: it exited, was interrupted, or did not return in time."""


class UserCodeTimeout(UserCodeError):
    """The recipe's own Python did not return within its deadline (it is still running, in a daemon thread)."""


class _Outcome:
    """What the worker thread left: a value, or what it raised."""

    def __init__(self) -> None:
        self.value: Any = None
        self.raised: BaseException | None = None
        self.done = threading.Event()


def call_user(what: str, function: Callable[..., Any], *args: Any, seconds: float | None = None,
              **kwargs: Any) -> Any:
    """``function(*args, **kwargs)``, the user's code named ``what`` ("task metric metrics.py:accuracy"), run in a
    daemon thread and waited for at most ``seconds`` (None: as long as it takes); see the module doc."""
    outcome = _Outcome()

    def work() -> None:
        try:
            outcome.value = function(*args, **kwargs)
        except BaseException as exc:  # SystemExit, KeyboardInterrupt: the user's code failing, reported below
            outcome.raised = exc
        finally:
            outcome.done.set()

    worker = threading.Thread(target=work, name=f"qdeploy user code: {what}", daemon=True)
    worker.start()
    if not _wait(outcome.done, seconds):
        raise UserCodeTimeout(f"{what} did not return within {seconds:g} s; it is left running until qdeploy exits")
    if outcome.raised is None:
        return outcome.value
    if isinstance(outcome.raised, Exception):
        raise outcome.raised
    raise UserCodeError(f"{what} {_ended(outcome.raised)}") from None


def _wait(done: threading.Event, seconds: float | None) -> bool:
    """Whether ``done`` was set within ``seconds`` (None: wait until it is)."""
    if seconds is None:
        while not done.wait(_POLL_SECONDS):
            pass
        return True
    return done.wait(seconds)


def _ended(raised: BaseException) -> str:
    """How user code that raised a BaseException ended, in words."""
    if isinstance(raised, SystemExit):
        return f"called sys.exit({raised.code!r}) instead of returning" if raised.code is not None else \
            "called sys.exit() instead of returning"
    if isinstance(raised, KeyboardInterrupt):
        return "raised KeyboardInterrupt"
    return f"raised {type(raised).__name__}: {raised}"


class UserFunction:
    """A user's function (``spec`` "metrics.py:accuracy"), called through ``call_user`` with a deadline; after a
    call that timed out it is not called again (the stuck call still runs)."""

    def __init__(self, function: Callable[..., Any], spec: str, *, kind: str = "task metric",
                 seconds: float | None = DEFAULT_METRIC_SECONDS) -> None:
        self.function, self.spec, self.kind, self.seconds = function, spec, kind, seconds
        self.stuck: str | None = None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.stuck is not None:
            raise UserCodeError(f"{self.stuck} (not called again)")
        try:
            return call_user(f"{self.kind} {self.spec}", self.function, *args, seconds=self.seconds, **kwargs)
        except UserCodeTimeout as exc:
            self.stuck = str(exc)
            raise


def import_user_module(module_part: str, resolve_path: Path | None, *, label: str) -> ModuleType:
    """Import 'path/to/file.py' (resolved beforehand by the caller) or 'package.module', through ``call_user``:
    an import that exits is a ``UserCodeError``; other errors propagate."""
    return call_user(f"{label} module {module_part} (importing it)", _import, module_part, resolve_path, label)


def _import(module_part: str, resolve_path: Path | None, label: str) -> ModuleType:
    if resolve_path is None:
        return importlib.import_module(module_part)
    spec = importlib.util.spec_from_file_location(f"qdeploy_{label}_{resolve_path.stem}", resolve_path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {resolve_path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module
