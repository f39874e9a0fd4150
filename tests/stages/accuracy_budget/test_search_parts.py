"""The engine's small parts: the prefix search and the one pinned-precision fallback."""

from __future__ import annotations

import pytest

from qdeploy.stages.accuracy_budget.precision import pinned_fallback
from qdeploy.stages.accuracy_budget.prefix import bisect, shortest_prefix
from qdeploy.targets.int8_path import FLAGS_ENV


@pytest.mark.parametrize("needed", [1, 2, 5, 37, 100])
def test_the_shortest_passing_prefix_costs_logarithmic_evaluations(needed: int) -> None:
    asked: list[int] = []

    def passes(count: int) -> bool:
        asked.append(count)
        return count >= needed

    failing, passing = shortest_prefix(passes, 0, 100)
    assert (failing, passing) == (needed - 1, needed)
    assert len(asked) <= 2 * 7 + 2
    asked.clear()
    assert bisect(passes, 0, 100) == needed and len(asked) <= 7


def test_no_prefix_passes_within_the_limit() -> None:
    assert shortest_prefix(lambda count: count >= 50, 0, 10) == (7, None)  # 1, 3, 7 fail, then the limit


def test_a_pin_holds_only_at_the_precision_it_asked_for(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(FLAGS_ENV, "avx2 avx512f avx512_bf16 avx512_fp16 amx_fp16")
    ran = {"f16": "f32", "f32": "f32"}  # the machine ignores the f16 hint: that attempt passes but does not hold
    fallback = pinned_fallback("openvino:cpu", "bf16", lambda hint: (True, ran[hint], f"run {hint}"))
    assert [pin.hint for pin in fallback.attempts] == ["f16", "f32"]
    assert not fallback.attempts[0].holds and fallback.held is not None and fallback.held.result == "run f32"


def test_no_pin_is_tried_where_it_cannot_help(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(FLAGS_ENV, "avx2 avx512f avx512_bf16")
    never = lambda hint: pytest.fail("no attempt expected")  # noqa: E731
    assert pinned_fallback("ort:cpu", "bf16", never).attempts == []
    assert pinned_fallback("openvino:cpu", "f32", never).attempts == []
    missed = pinned_fallback("openvino:cpu", "bf16", lambda hint: (False, hint, None))
    assert [pin.hint for pin in missed.attempts] == ["f32"] and missed.held is None
