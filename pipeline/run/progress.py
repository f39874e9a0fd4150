"""One progress display over a whole run: the stage, the variant and the target in hand, and the time spent.

The runner calls ``phase`` when a unit of work begins (``"simplify · fp16"``, ``"validate"``,
``"benchmark"``), stages call ``detail`` through ``StageContext.on_progress`` for finer steps
(``"int8 · openvino:cpu · batch 1: round 2/5"``), and ``done`` when the unit is finished.  The line reads
``benchmark › int8 · openvino:cpu · batch 1: round 2/5 ━━━━━━ 8/9   4.2s in phase · 0:00:21 total``.
Every phase's duration is kept in ``timings`` (seconds, in order) for a summary after the run.

Where ``QDEPLOY_RUN_JOURNAL`` names a folder (``qdeploy run`` sets it for the process it supervises), what the
display shows is also kept in the file ``WHERE_FILE`` there, rewritten at each step: what the run had in hand
when a native library ended its process (``qdeploy.cli.supervise``).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from types import TracebackType
from typing import IO, Any

__all__ = ["JOURNAL_ENV", "WHERE_FILE", "Progress", "journal_folder"]

JOURNAL_ENV = "QDEPLOY_RUN_JOURNAL"
"""A folder where the supervised run keeps what it is doing (``WHERE_FILE``) and the stacks of a crash."""
WHERE_FILE = "where.txt"


class Progress:
    """A rich progress display on stderr when enabled; silent otherwise (quiet mode, tests, CI logs)."""

    def __init__(self, total: int, *, enabled: bool = True, console: Any = None) -> None:
        self._total = total
        self._console = console
        self._enabled = enabled
        self._progress: Any = None
        self._task: Any = None
        self._phase = ""
        self._open = False
        self._detail = ""
        self._phase_started = time.perf_counter()
        self._journal = _open_journal()
        self.timings: dict[str, float] = {}
        """Seconds spent in each phase, in the order the phases ran (a repeated phase adds up)."""

    def __enter__(self) -> Progress:
        if self._enabled:
            self._progress = _rich_progress(self._console)
            self._progress.__enter__()
            self._task = self._progress.add_task("starting", total=self._total, phase_started=self._phase_started)
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self._close_phase()
        if self._progress is not None:
            self._progress.__exit__(kind, error, trace)
        if self._journal is not None:
            self._journal.close()
            self._journal = None

    def phase(self, description: str) -> None:
        """A new unit of work begins (a stage of a variant, a validation, a benchmark)."""
        self._close_phase()
        self._phase = description
        self._open = True
        self._detail = ""
        self._phase_started = time.perf_counter()
        self._show()

    def detail(self, message: str) -> None:
        """A finer step inside the current unit of work: the variant, target and step being worked on."""
        self._detail = message
        self._show()

    def done(self) -> None:
        """The current unit of work is finished."""
        self._close_phase()
        if self._progress is not None:
            self._progress.advance(self._task)

    @property
    def description(self) -> str:
        """What the display shows now: the phase and, after ›, the detail."""
        return f"{self._phase} › {self._detail}" if self._detail else self._phase

    def _close_phase(self) -> None:
        if self._open:
            spent = time.perf_counter() - self._phase_started
            self.timings[self._phase] = self.timings.get(self._phase, 0.0) + spent
            self._open = False

    def _show(self) -> None:
        if self._progress is not None:
            self._progress.update(self._task, description=self.description, phase_started=self._phase_started)
        if self._journal is not None:  # flushed to the OS: a crash of the process leaves it readable
            self._journal.seek(0)
            self._journal.truncate()
            self._journal.write(self.description)
            self._journal.flush()


def journal_folder() -> Path | None:
    """The journal folder of a supervised run, when this process is one (else None)."""
    folder = os.environ.get(JOURNAL_ENV)
    return Path(folder) if folder and Path(folder).is_dir() else None


def _open_journal() -> IO[str] | None:
    """The where-file of a supervised run, when this process is one (else None)."""
    folder = journal_folder()
    if folder is None:
        return None
    try:
        return (folder / WHERE_FILE).open("w", encoding="utf-8")
    except OSError:  # the supervisor's folder went away: the display is what matters
        return None


def _rich_progress(console: Any = None) -> Any:
    """A rich Progress: step count, what is in hand, a bar, time in the current phase and in all."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, ProgressColumn, TextColumn, TimeElapsedColumn
    from rich.progress import Progress as RichProgress
    from rich.text import Text

    class PhaseElapsedColumn(ProgressColumn):
        """Seconds since the current phase began, live."""

        def render(self, task: Any) -> Text:
            started = task.fields.get("phase_started", time.perf_counter())
            return Text(f"{time.perf_counter() - started:5.1f}s in phase", style="cyan")

    return RichProgress(
        TextColumn("[bold]{task.description}"), BarColumn(bar_width=24), MofNCompleteColumn(),
        PhaseElapsedColumn(), TextColumn("·"),
        TimeElapsedColumn(), TextColumn("total"), console=console or Console(stderr=True), transient=False,
    )
