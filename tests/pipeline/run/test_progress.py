"""The progress display: what it says is in hand, and the time each phase took."""

from __future__ import annotations

import io

from rich.console import Console

from qdeploy.pipeline.run.progress import Progress


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
