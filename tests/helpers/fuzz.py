"""What the fuzz tests share (tests/robustness/test_fuzz*.py): the suite's hypothesis profile and budget, the
per-example time guard, and `qdeploy` run in this process next to a copy of the demo's model and data.

The suite's profile is deterministic (derandomize: the same examples on every run, no example database), so CI
sees the same campaign each time.  QDEPLOY_FUZZ_EXAMPLES=N runs a longer, random campaign locally: every fuzz test
draws N examples (the `run` campaign N/10, at least its suite budget), e.g.
``QDEPLOY_FUZZ_EXAMPLES=2000 python -m pytest -p no:cacheprovider tests/robustness/test_fuzz*.py``.
"""

from __future__ import annotations

import contextlib
import faulthandler
import logging
import os
import shutil
import signal
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

from hypothesis import HealthCheck, settings
from typer.testing import CliRunner, Result

from qdeploy.cli import app
from tests.helpers.models import DEMO_RECIPE

__all__ = ["EXAMPLES_ENV", "ExampleHung", "assert_clean_exit", "demo_copy", "fuzz_settings", "invoke", "time_limit"]

EXAMPLES_ENV = "QDEPLOY_FUZZ_EXAMPLES"
"""Examples per fuzz test for a longer local campaign (unset: the suite's fixed budget)."""


def fuzz_settings(examples: int, *, cost: int = 1, seconds: float = 10) -> settings:
    """The suite's profile with `examples` examples of at most `seconds` each (the hypothesis deadline).

    With QDEPLOY_FUZZ_EXAMPLES=N the test draws max(examples, N // cost) random examples instead: `cost` scales
    the long campaign down for tests whose examples are expensive.
    """
    longer = int(os.environ.get(EXAMPLES_ENV) or 0)
    return settings(max_examples=max(examples, longer // cost), derandomize=not longer, database=None,
                    deadline=timedelta(seconds=seconds), print_blob=True,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                           HealthCheck.data_too_large])


class ExampleHung(BaseException):
    """An example ran past its time limit.  A BaseException: qdeploy's own `except Exception` cannot swallow it."""


@contextlib.contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    """Fail the example after `seconds` instead of freezing the suite.

    SIGALRM interrupts Python code and blocking system calls; code stuck in a C extension never returns to the
    interpreter, so a watchdog thread (faulthandler) dumps every stack and exits the process at twice the limit
    (it stands in for pytest's faulthandler_timeout, unset in this project, during the example).
    """
    def hung(signum: int, frame: object) -> None:
        raise ExampleHung(f"the example ran past its time limit of {seconds} s (a hang?)")

    previous = signal.signal(signal.SIGALRM, hung)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    faulthandler.dump_traceback_later(2 * seconds, exit=True)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        faulthandler.cancel_dump_traceback_later()


def demo_copy(folder: Path) -> Path:
    """A copy of the demo's model and data in `folder`: a recipe written there can be valid."""
    for part in ("models", "data"):
        shutil.copytree(DEMO_RECIPE.parent / part, folder / part)
    return folder


def invoke(*args: str, seconds: float) -> Result:
    """`qdeploy ARGS` in this process, as the CLI runs it; an exception that escapes the CLI fails the example.
    The CLI points logging at the runner's stderr, which closes after: the handlers before are put back."""
    root, ours = logging.getLogger(), logging.getLogger("qdeploy")
    handlers, level = root.handlers[:], ours.level
    try:
        with time_limit(seconds):
            return CliRunner().invoke(app, list(args), catch_exceptions=False)
    finally:
        root.handlers[:] = handlers
        ours.setLevel(level)


def assert_clean_exit(result: Result, codes: tuple[int, ...] = (0, 2)) -> None:
    """An expected exit status, and no traceback or internal error in stdout or stderr."""
    output = result.output
    assert result.exit_code in codes, f"exit {result.exit_code}: {output[-3000:]}"
    for sign in ("Traceback", "internal error"):
        assert sign not in output, output[-3000:]
