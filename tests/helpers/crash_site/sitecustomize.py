"""Imported at start-up by each Python process whose PYTHONPATH holds this folder (a test's ``qdeploy run``):
where ``QDEPLOY_TEST_CRASH`` is "segv", "kill" or "hang", the process that opens a file whose path holds
``QDEPLOY_TEST_CRASH_ON`` ends there, by a real segmentation fault or SIGKILL (as a native library or the kernel's
out-of-memory killer would end it), or waits there for a signal."""

import os
import sys

_HOW = os.environ.get("QDEPLOY_TEST_CRASH")
_ON = os.environ.get("QDEPLOY_TEST_CRASH_ON", "")


def _end_on_open(event: str, args: tuple) -> None:
    if event == "open" and _ON and _ON in str(args[0]):
        if _HOW == "hang":
            import time

            time.sleep(600)
        if _HOW == "kill":
            import signal

            os.kill(os.getpid(), signal.SIGKILL)
        import ctypes

        ctypes.string_at(0)


if _HOW in ("segv", "kill", "hang"):
    sys.addaudithook(_end_on_open)
