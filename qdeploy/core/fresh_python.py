"""A function called in a fresh Python interpreter, for work whose imports or memory the run must not keep.

``call_in_fresh_python("pkg.module", "function", payload)`` starts ``sys.executable``, imports the module there
and calls ``function(payload)`` with a JSON-able dict; the JSON-able dict it returns comes back.  Not
``multiprocessing``: its ``spawn`` start re-imports the caller's main script in the child, so a user script that
calls ``qdeploy.run`` without an ``if __name__ == "__main__"`` guard would run again there; and its ``fork``
copies a process that may hold gigabytes.  The child sees the caller's ``sys.path``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

__all__ = ["FreshPythonError", "call_in_fresh_python", "ended"]

_CHILD = """
import json, sys
from importlib import import_module
payload = json.loads(open(sys.argv[3]).read())
result = getattr(import_module(sys.argv[1]), sys.argv[2])(payload)
with open(sys.argv[4], "w") as out:
    json.dump(result, out)
"""
_STDERR_TAIL = 2000


class FreshPythonError(RuntimeError):
    """The child interpreter did not return a result (it crashed, was killed, or raised); ``signal``: the signal
    that ended it, None when it exited or raised."""

    def __init__(self, message: str, signal: int | None = None) -> None:
        super().__init__(message)
        self.signal = signal


def ended(call: str, returncode: int, stderr: str) -> FreshPythonError:
    """The error for a child that ended with ``returncode`` (negative: killed by that signal) without a result."""
    how = f"exit status {returncode}" if returncode >= 0 else f"signal {-returncode}"
    return FreshPythonError(f"{call} in a child process ended with {how}: {stderr or 'no message'}",
                            signal=-returncode if returncode < 0 else None)


def call_in_fresh_python(module: str, function: str, payload: dict[str, Any]) -> dict[str, Any]:
    """``module.function(payload)`` in a new interpreter; its JSON result.  FreshPythonError with the end of the
    child's stderr when it gives none (an exception the function raised is said there)."""
    with tempfile.TemporaryDirectory(prefix="qdeploy-child-") as folder:
        given, taken = Path(folder) / "payload.json", Path(folder) / "result.json"
        given.write_text(json.dumps(payload))
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(path for path in sys.path if path)}
        done = subprocess.run([sys.executable, "-c", _CHILD, module, function, str(given), str(taken)],
                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, check=False)
        if done.returncode != 0 or not taken.is_file():
            raise ended(f"{module}.{function}", done.returncode, done.stderr.strip()[-_STDERR_TAIL:])
        result: dict[str, Any] = json.loads(taken.read_text())
        return result
