"""`qdeploy run` in a child process of its own, so that a crash inside a native library is reported, not fatal.

ONNX Runtime, OpenVINO and onnx are C++ libraries: on some graphs they end the process with a signal (a
segmentation fault, an abort) instead of raising, and the kernel's out-of-memory killer ends a process with
SIGKILL.  The run guards the places where that was seen (``qdeploy.targets.ort_probe``, ``openvino_probe``);
anywhere else the terminal got "Segmentation fault" and nothing about the run.  The ``qdeploy`` command now runs
the recipe in a child (the same command line) and, when a signal ends it, says what the run had in hand (the
progress display's last line, ``qdeploy.pipeline.run.progress``), where in qdeploy and in which library (the
child's Python stacks, written by ``faulthandler``), and what to do; the exit status is 1, as for a failed stage.
The child inherits the terminal, so its progress display and summary are the user's.  ``QDEPLOY_NO_SUPERVISOR=1``
runs in one process (for a debugger).

The child's temporary folder (``TMPDIR``) is a folder of the journal's, removed when the child ends however it
ends: a run killed by the out-of-memory killer, a crash or a cancelled CI job (SIGTERM ends the child before its
``finally`` blocks run) left its work folders, preprocessed models and external data behind in /tmp.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from types import FrameType
from typing import IO

from qdeploy.core.files import SHARED_TMPDIR_ENV
from qdeploy.pipeline.run.progress import JOURNAL_ENV, WHERE_FILE, journal_folder

__all__ = ["SCRATCH_FOLDER", "STACKS_FILE", "crash_message", "enable_crash_stacks", "supervised"]

SUPERVISED_COMMANDS = frozenset({"run"})
STACKS_FILE = "stacks.txt"
SCRATCH_FOLDER = "tmp"
_FORWARDED = (signal.SIGTERM, signal.SIGHUP)
_STOPPED_FROM_OUTSIDE = (*_FORWARDED, signal.SIGINT)
_PR_SET_PDEATHSIG = 1
_STACKS: list[IO[str]] = []  # the child's stacks file, open for the life of the process (faulthandler writes to it)
_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<function>\S+)')


def supervised(argv: list[str]) -> int | None:
    """The exit status of the command ``argv`` run in a supervised child, or None where it runs here: not a
    supervised command, already the child, asked not to (``QDEPLOY_NO_SUPERVISOR``), or only asking for help."""
    if (not argv or argv[0] not in SUPERVISED_COMMANDS or os.environ.get(JOURNAL_ENV)
            or os.environ.get("QDEPLOY_NO_SUPERVISOR") or "--help" in argv
            or getattr(sys, "frozen", False)):  # a bundled executable has no `-m qdeploy.cli` to start
        return None
    try:
        journal = Path(tempfile.mkdtemp(prefix="qdeploy-run-"))
    except OSError:  # no writable temporary folder: run here, unsupervised, rather than not at all
        return None
    scratch = journal / SCRATCH_FOLDER
    scratch.mkdir()
    child = subprocess.Popen([sys.executable, "-m", "qdeploy.cli", *argv], preexec_fn=_die_with_parent,
                             env={**os.environ, JOURNAL_ENV: str(journal), "TMPDIR": str(scratch),
                                  SHARED_TMPDIR_ENV: tempfile.gettempdir()})
    status = _wait(child)
    shutil.rmtree(scratch, ignore_errors=True)
    if status >= 0 or -status in _STOPPED_FROM_OUTSIDE:
        shutil.rmtree(journal, ignore_errors=True)
        return status if status >= 0 else 128 - status
    print(crash_message(-status, journal), file=sys.stderr)
    return 1


def _die_with_parent() -> None:
    """In the child before it starts: SIGKILL when this process dies, as one process would have died whole."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):  # not Linux: a killed supervisor leaves the run to finish
        pass


def _wait(child: subprocess.Popen[bytes]) -> int:
    """The child's return code.  Ctrl-C reaches the child from the terminal (it stops cleanly, exit 130); a
    SIGTERM or SIGHUP sent to this process (a CI job cancelled) is passed on to it."""
    def forward(signum: int, _frame: FrameType | None) -> None:
        child.send_signal(signum)

    previous = {signum: signal.signal(signum, forward) for signum in _FORWARDED}
    previous[signal.SIGINT] = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        return child.wait()
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def enable_crash_stacks() -> None:
    """In the supervised child: on a fatal signal, Python's stacks go to the journal folder (``faulthandler``)."""
    import faulthandler

    folder = journal_folder()
    if folder is not None and not _STACKS:
        _STACKS.append((folder / STACKS_FILE).open("w", encoding="utf-8"))
        faulthandler.enable(file=_STACKS[0], all_threads=True)


def crash_message(signum: int, journal: Path) -> str:
    """What to tell the user when signal ``signum`` ended the run, from what its journal folder holds."""
    where = _read(journal / WHERE_FILE).strip() or "starting"
    frames = _current_thread_frames(_read(journal / STACKS_FILE))
    lines = [f"qdeploy run: the run's process was ended by signal {signum} ({_signal_name(signum)}) during "
             f"\"{where}\"{_frames_said(frames)}."]
    if signum == signal.SIGKILL:
        lines.append("SIGKILL from no one in particular is usually the kernel's out-of-memory killer (`dmesg` says "
                     "so): run fewer variants or targets at a time (--variant, --target), fewer validation samples, "
                     "or use a machine with more memory (docs/how-to/troubleshooting.md).")
    else:
        lines.append("A crash inside a native library (ONNX Runtime, OpenVINO, onnx), not an error in the recipe: "
                     "leave the variant or target it names out (--variant, --target, or the recipe) and run "
                     "again; what finished is reused from the cache (docs/how-to/troubleshooting.md).")
    if frames:
        lines.append(f"Python's stacks at the crash: {journal / STACKS_FILE} (attach it to a bug report).")
    return "\n".join(lines)


def _signal_name(signum: int) -> str:
    try:
        name = signal.Signals(signum).name
    except ValueError:
        return "an unknown signal"
    return {"SIGSEGV": "SIGSEGV, a segmentation fault", "SIGABRT": "SIGABRT, an abort"}.get(name, name)


def _current_thread_frames(stacks: str) -> list[tuple[str, str, str]]:
    """(file, line, function) of the crashing thread, innermost first, from faulthandler's dump."""
    frames: list[tuple[str, str, str]] = []
    inside = False
    for line in stacks.splitlines():
        if line.startswith("Current thread"):
            inside = True
        elif inside and (found := _FRAME.match(line)):
            frames.append((found["file"], found["line"], found["function"]))
        elif inside and frames and not line.strip():
            break
    return frames


def _frames_said(frames: list[tuple[str, str, str]]) -> str:
    """", in <library call> called from <qdeploy's innermost frame>", as far as the stacks say."""
    if not frames:
        return ""
    ours = _qdeploy_roots()
    innermost = frames[0]
    own = next((frame for frame in frames if _under(frame[0], ours)), None)
    said = f", in {_short(innermost)}"
    if own is not None and own is not innermost:
        said += f" called from {_short(own)}"
    return said


def _short(frame: tuple[str, str, str]) -> str:
    path = Path(frame[0])
    return f"{'/'.join(path.parts[-2:])}:{frame[1]} ({frame[2]})"


def _qdeploy_roots() -> list[Path]:
    """The folders qdeploy's code lives in: one when installed, the repository's top folders when editable."""
    import importlib.util

    roots = []
    for name in ("qdeploy", "qdeploy.stages", "qdeploy.pipeline", "qdeploy.calibration"):
        spec = importlib.util.find_spec(name)
        roots += [Path(location).resolve() for location in (spec.submodule_search_locations or [])] if spec else []
    return roots


def _under(file: str, roots: list[Path]) -> bool:
    path = Path(file).resolve()
    return any(path.is_relative_to(root) for root in roots)


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
