"""``call_user``: the recipe's Python run under a deadline, its exits and interrupts said as its own failure."""

from __future__ import annotations

import re
import sys
import threading
import time

import pytest

from qdeploy.core.errors import QdeployInputError
from qdeploy.core.usercode import UserCodeError, UserCodeTimeout, UserFunction, call_user


def test_a_value_and_an_ordinary_exception_come_back_as_from_a_direct_call() -> None:
    assert call_user("f", lambda a, b=0: a + b, 1, b=2, seconds=5) == 3
    with pytest.raises(ZeroDivisionError):
        call_user("f", lambda: 1 / 0)


def _interrupt() -> None:
    raise KeyboardInterrupt


@pytest.mark.parametrize(("body", "said"), [(lambda: sys.exit(3), "called sys.exit(3) instead of returning"),
                                            (lambda: sys.exit(), "called sys.exit() instead of returning"),
                                            (_interrupt, "raised KeyboardInterrupt")])
def test_an_exit_or_an_interrupt_is_a_typed_error_naming_the_code(body: object, said: str) -> None:
    with pytest.raises(UserCodeError, match=re.escape(f"task metric m.py:f {said}")) as raised:
        call_user("task metric m.py:f", body)
    assert isinstance(raised.value, QdeployInputError) and raised.value.exit_code == 2


def test_a_call_past_its_deadline_ends_and_the_function_is_not_called_again() -> None:
    release = threading.Event()
    calls = []

    def stuck(*args: object) -> float:
        calls.append(args)
        release.wait(30)
        return 1.0

    metric = UserFunction(stuck, "m.py:stuck", seconds=0.2)
    started = time.monotonic()
    with pytest.raises(UserCodeTimeout, match=r"task metric m.py:stuck did not return within 0.2 s"):
        metric({}, None)
    assert time.monotonic() - started < 5
    with pytest.raises(UserCodeError, match="not called again"):
        metric({}, None)
    assert len(calls) == 1
    release.set()


def test_the_worker_is_a_daemon_so_a_stuck_call_never_holds_the_process_open() -> None:
    seen = []

    def record() -> None:
        seen.append(threading.current_thread().daemon)

    call_user("f", record)
    assert seen == [True]
