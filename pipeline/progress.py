"""One progress display over a whole run: the work in hand and the time spent."""

from __future__ import annotations

import time
from types import TracebackType
from typing import Any


class Progress:
    """A rich progress bar when enabled; silent otherwise (quiet mode, tests, CI logs)."""

    def __init__(self, total: int, *, enabled: bool = True) -> None:
        self._total = total
        self._enabled = enabled
        self._progress: Any = None
        self._task: Any = None
        self._phase = ""
        self._phase_started = time.perf_counter()

    def __enter__(self) -> Progress:
        if self._enabled:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
            from rich.progress import Progress as RichProgress

            self._progress = RichProgress(
                TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                console=Console(stderr=True), transient=False,
            )
            self._progress.__enter__()
            self._task = self._progress.add_task("starting", total=self._total)
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        if self._progress is not None:
            self._progress.__exit__(kind, error, trace)

    def phase(self, description: str) -> None:
        """A new unit of work begins (a stage of a variant, a validation, a benchmark)."""
        self._phase = description
        self._phase_started = time.perf_counter()
        self._show(description)

    def detail(self, message: str) -> None:
        """A finer step inside the current unit of work."""
        self._show(message)

    def done(self) -> None:
        """The current unit of work is finished."""
        if self._progress is not None:
            self._progress.advance(self._task)

    def _show(self, message: str) -> None:
        if self._progress is not None:
            spent = time.perf_counter() - self._phase_started
            self._progress.update(self._task, description=f"{message} ({spent:.0f}s)")
