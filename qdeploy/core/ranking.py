"""When a benchmark can say that one artifact is faster than another: the rule the verdict ranks by and the benchmark
stage uses to decide whether more rounds are worth taking on a busy machine.

Runs of the artifacts are interleaved in rounds, so each round gives a pair of medians measured under the same
state of the machine.  ``best`` is better than ``candidate`` when either

- a one-sided sign test over the paired rounds says so at the 5% level (with 5 rounds: every round agrees; with
  10: all but one; with 15: all but three; with 3 or 4 rounds, which cannot reach that level, every round
  must agree), or
- the 95% intervals of the two medians do not overlap (one noisy round must not make a 4.8x gap a tie).

With fewer than 3 rounds only the intervals speak.  Anything else is a tie: the benchmark cannot tell the two apart.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

__all__ = ["MIN_ROUNDS_FOR_SIGN", "SIGN_LEVEL", "distinguishable", "sign_test_allows"]

MIN_ROUNDS_FOR_SIGN = 3
SIGN_LEVEL = 0.05
"""One-sided level of the sign test: the chance that two equal artifacts come out 'different'."""


def sign_test_allows(rounds: int) -> int:
    """The most rounds that may disagree (candidate at least as good as best) for the sign test to still say best
    is better; -1 when no count of ``rounds`` reaches the level (too few rounds)."""
    allowed, mass = -1, 0.0
    for disagree in range(rounds + 1):
        mass += math.comb(rounds, disagree) / 2 ** rounds
        if mass > SIGN_LEVEL:
            break
        allowed = disagree
    return allowed


def _disjoint(candidate: Sequence[float] | None, best: Sequence[float] | None) -> bool:
    return bool(candidate) and bool(best) and min(candidate) > max(best)  # type: ignore[arg-type]


def distinguishable(candidate_rounds: Sequence[float], best_rounds: Sequence[float],
                    candidate_interval: Sequence[float] | None = None,
                    best_interval: Sequence[float] | None = None) -> bool:
    """Whether the benchmark says ``best`` is better than ``candidate`` (scores: lower is better, per round)."""
    if _disjoint(candidate_interval, best_interval):
        return True
    pairs = list(zip(candidate_rounds, best_rounds, strict=False))
    if len(pairs) < MIN_ROUNDS_FOR_SIGN:
        return False
    disagree = sum(1 for mine, theirs in pairs if mine <= theirs)
    return disagree <= max(sign_test_allows(len(pairs)), 0)
