"""One long-lived child serves the crash-prone checks (``qdeploy.core.child_worker``): results come back over a
channel a runtime's stdout cannot break, a crash is said as ``call_in_fresh_python`` says it and the next call gets
a new child, and large models go to a child of their own."""

from __future__ import annotations

import os

import pytest

from qdeploy.core.child_worker import WORKER_MAX_BYTES, call_in_worker, call_isolated
from qdeploy.core.fresh_python import FreshPythonError

HELPERS = "tests.helpers.fresh"


def test_calls_share_one_child_that_is_not_this_process() -> None:
    first = call_in_worker(HELPERS, "pid", {})["pid"]
    assert first != os.getpid() and call_in_worker(HELPERS, "pid", {})["pid"] == first
    assert call_in_worker(HELPERS, "echo", {"a": [1, 2]})["got"] == {"a": [1, 2]}


def test_writing_on_stdout_does_not_break_the_reply() -> None:
    assert call_in_worker(HELPERS, "noisy", {}) == {"quiet": True}
    assert call_in_worker(HELPERS, "echo", {"b": 1})["got"] == {"b": 1}  # nothing left over in the channel


def test_a_crash_is_said_and_the_next_call_gets_a_new_child() -> None:
    before = call_in_worker(HELPERS, "pid", {})["pid"]
    with pytest.raises(FreshPythonError, match=r"tests.helpers.fresh.segfault in a child process ended with signal 11"):
        call_in_worker(HELPERS, "segfault", {})
    after = call_in_worker(HELPERS, "pid", {})["pid"]
    assert after != before


def test_an_exception_comes_back_with_its_message_and_the_child_lives() -> None:
    before = call_in_worker(HELPERS, "pid", {})["pid"]
    with pytest.raises(FreshPythonError, match=r"(?s)raised: .*ValueError: asked to fail: on purpose"):
        call_in_worker(HELPERS, "crash", {"why": "on purpose"})
    assert call_in_worker(HELPERS, "pid", {})["pid"] == before


def test_a_large_model_gets_a_child_of_its_own() -> None:
    kept = call_isolated(HELPERS, "pid", {}, model_bytes=WORKER_MAX_BYTES)["pid"]
    own = {call_isolated(HELPERS, "pid", {}, model_bytes=WORKER_MAX_BYTES + 1)["pid"] for _ in range(2)}
    assert kept == call_in_worker(HELPERS, "pid", {})["pid"] and kept not in own and len(own) == 2
