"""The benchmark's ranking rule in words: the evidence a rejection prints is the test that decided, and nothing
when no test did."""

from __future__ import annotations

import pytest

from qdeploy.core.ranking import apart_by, distinguishable


@pytest.mark.parametrize(("candidate", "best", "intervals", "paired", "words"), [
    ([2.0, 2.1, 2.2], [1.0, 1.1, 1.2], ([1.9, 2.3], [0.9, 1.3]), True, "the 95% intervals do not overlap"),
    ([1.01, 1.11, 1.21, 1.31], [1.0, 1.1, 1.2, 1.3], None, True,
     "behind in all 4 paired rounds (too few for the sign test's 5% level)"),
    ([1.01, 1.11, 1.21, 1.31, 1.41, 1.51, 1.61, 1.0], [1.0, 1.1, 1.2, 1.3, 1.4, 1.5, 1.6, 1.05], None, True,
     "behind in 7 of 8 paired rounds (sign test, p = 0.035)"),
    ([3.0, 3.1, 3.2, 3.3], [1.0, 1.1, 1.2], None, False,
     "its 4 rounds rank above the other's 3, timed in another group (rank test, p = 0.029)"),
])
def test_the_evidence_names_the_test_that_decided(candidate: list[float], best: list[float],
                                                   intervals: tuple[list[float], list[float]] | None, paired: bool,
                                                   words: str) -> None:
    said = apart_by(candidate, best, *(intervals or (None, None)), paired=paired)
    assert said == words
    assert distinguishable(candidate, best, *(intervals or (None, None)), paired=paired) == bool(said)


def test_one_round_the_other_way_in_three_is_no_evidence() -> None:
    assert apart_by([1.01, 0.9, 1.21], [1.0, 1.1, 1.2]) == ""
    assert apart_by([1.01, 1.11], [1.0, 1.1]) == ""  # two rounds: only intervals speak
    assert apart_by([1.01, 1.11, 1.21, 1.31, 1.41, 1.0], [1.0, 1.1, 1.2, 1.3, 1.4, 1.05]) == ""  # 5 of 6: p = 0.11
