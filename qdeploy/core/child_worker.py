"""Small calls in one long-lived child interpreter, for checks that may crash the process (a runtime loading a
model).

``call_in_fresh_python`` starts an interpreter per call: about 0.25 s of imports before an OpenVINO compile or an
ONNX Runtime load that takes milliseconds on a small model, paid for every artifact and every load of the fp16
stage's search.  ``call_in_worker`` keeps one child per process and sends it each call; when the child dies (the
runtime crashed it), the call raises ``FreshPythonError`` saying how, in the words ``call_in_fresh_python`` uses
("... ended with signal 11: ..."), and the next call starts a new child.  An exception the function raises comes
back as ``FreshPythonError`` too ("... raised: ...").

For small models only: the child keeps what a runtime leaves allocated between calls, so callers send large
models to ``call_in_fresh_python`` (``WORKER_MAX_BYTES``).  The child writes its results on a descriptor of its
own: a runtime printing on its stdout cannot break a reply.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import threading
from typing import IO, Any

from qdeploy.core.fresh_python import FreshPythonError, call_in_fresh_python, ended

__all__ = ["WORKER_MAX_BYTES", "call_in_worker", "call_isolated"]

WORKER_MAX_BYTES = 64 << 20
"""Models above this size (with their external data) are loaded by a child of their own, which exits after."""

_CHILD = """
import json, os, sys, traceback
from importlib import import_module
replies = os.fdopen(os.dup(1), "w")
os.dup2(2, 1)
sys.stdout = sys.stderr
for line in sys.stdin:
    request = json.loads(line)
    try:
        reply = {"result": getattr(import_module(request["module"]), request["function"])(request["payload"])}
    except Exception:
        reply = {"raised": traceback.format_exc()[-2000:]}
    replies.write(json.dumps(reply) + "\\n")
    replies.flush()
"""
_STDERR_TAIL = 2000


class _Worker:
    """One child and the file its stderr goes to; restarted after it dies."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._process: subprocess.Popen[str] | None = None
        self._stderr: IO[bytes] | None = None
        self._owner = os.getpid()

    def call(self, module: str, function: str, payload: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            process, stderr = self._started()
            start = stderr.seek(0, os.SEEK_END)
            line = self._ask(process, json.dumps({"module": module, "function": function, "payload": payload}))
            if not line:
                error = ended(f"{module}.{function}", process.wait(), _tail(stderr, start))
                self.close()
                raise error
            reply = json.loads(line)
            if "raised" in reply:
                raise FreshPythonError(f"{module}.{function} in a child process raised: {reply['raised']}")
            result: dict[str, Any] = reply["result"]
            return result

    @staticmethod
    def _ask(process: subprocess.Popen[str], request: str) -> str:
        assert process.stdin is not None and process.stdout is not None
        try:
            process.stdin.write(request + "\n")
            process.stdin.flush()
        except BrokenPipeError:
            return ""
        return process.stdout.readline()

    def _started(self) -> tuple[subprocess.Popen[str], IO[bytes]]:
        if self._owner != os.getpid():  # a forked copy of the parent: its child and pipes are the parent's
            self._process, self._stderr, self._owner = None, None, os.getpid()
        if self._process is None or self._stderr is None or self._process.poll() is not None:
            self.close()
            self._stderr = tempfile.TemporaryFile(prefix="qdeploy-worker-")  # noqa: SIM115  closed in close()
            env = {**os.environ, "PYTHONPATH": os.pathsep.join(path for path in sys.path if path)}
            self._process = subprocess.Popen([sys.executable, "-c", _CHILD], stdin=subprocess.PIPE,
                                             stdout=subprocess.PIPE, stderr=self._stderr, env=env, text=True)
        return self._process, self._stderr

    def close(self) -> None:
        """End the child (it exits when its stdin closes) and forget it."""
        process, self._process = self._process, None
        if process is not None:
            if process.stdin is not None:
                with contextlib.suppress(OSError):  # a child that died leaves a broken pipe to close
                    process.stdin.close()
            try:
                process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            if process.stdout is not None:
                process.stdout.close()
        if self._stderr is not None:
            self._stderr.close()
            self._stderr = None


def _tail(stderr: IO[bytes], start: int) -> str:
    stderr.seek(start)
    return stderr.read().decode(errors="replace").strip()[-_STDERR_TAIL:]


_WORKER = _Worker()
atexit.register(_WORKER.close)


def call_in_worker(module: str, function: str, payload: dict[str, Any]) -> dict[str, Any]:
    """``module.function(payload)`` in this process's worker child; its JSON result.  FreshPythonError when the
    child dies on it (it is restarted for the next call) or the function raises."""
    return _WORKER.call(module, function, payload)


def call_isolated(module: str, function: str, payload: dict[str, Any], *, model_bytes: int) -> dict[str, Any]:
    """The call in the worker for a model of at most ``WORKER_MAX_BYTES``, else in a child of its own."""
    if model_bytes <= WORKER_MAX_BYTES:
        return call_in_worker(module, function, payload)
    return call_in_fresh_python(module, function, payload)
