"""The progress display: what it says is in hand, and the time each phase took."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from rich.console import Console

from qdeploy.pipeline.run.progress import JOURNAL_ENV, WHERE_FILE, Progress


def test_description_names_phase_and_detail_and_timings_add_up() -> None:
    with Progress(3, enabled=False) as progress:
        progress.phase("simplify · fp16")
        assert progress.description == "simplify · fp16"
        progress.detail("folding constants")
        assert progress.description == "simplify · fp16 › folding constants"
        progress.done()
        progress.phase("benchmark")
        progress.detail("int8 · openvino:cpu · batch 1: round 2/5")
        assert progress.description == "benchmark › int8 · openvino:cpu · batch 1: round 2/5"
        progress.done()
        progress.phase("simplify · fp16")  # a repeated phase adds up
    assert list(progress.timings) == ["simplify · fp16", "benchmark"]
    assert all(seconds >= 0 for seconds in progress.timings.values())


def test_enabled_display_shows_the_work_in_hand() -> None:
    buffer = io.StringIO()
    with Progress(2, enabled=True, console=Console(file=buffer, force_terminal=False, width=200)) as progress:
        progress.phase("validate")
        progress.detail("validate int8 on openvino:cpu")
        progress.done()
    shown = buffer.getvalue()
    assert "validate › validate int8 on openvino:cpu" in shown
    assert "in phase" in shown and "1/2" in shown


def test_a_supervised_run_keeps_the_line_in_its_journal(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What the display shows is in the where-file at every step, for the supervisor to say after a crash."""
    monkeypatch.setenv(JOURNAL_ENV, str(tmp_path))
    where = tmp_path / WHERE_FILE
    with Progress(2, enabled=False) as progress:
        progress.phase("validate")
        progress.detail("int8 · openvino:cpu")
        assert where.read_text() == "validate › int8 · openvino:cpu"
        progress.phase("benchmark")  # a shorter line replaces a longer one whole
        assert where.read_text() == "benchmark"
