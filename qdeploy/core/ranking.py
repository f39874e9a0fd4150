"""When a benchmark can say that one artifact is faster than another: the rule the verdict ranks by and the benchmark
stage uses to decide whether more rounds are worth taking on a busy machine.

Runs of the artifacts are interleaved in rounds, so each round gives a pair of medians measured under the same
state of the machine.  ``best`` is better than ``candidate`` when either

- a one-sided sign test over the paired rounds says so at the 5% level (with 5 rounds: every round agrees; with
  10: all but one; with 15: all but three; with 3 or 4 rounds, which cannot reach that level, every round
  must agree), or
- the 95% intervals of the two medians do not overlap (one noisy round must not make a 4.8x gap a tie).

With fewer than 3 rounds only the intervals speak.  Anything else is a tie: the benchmark cannot tell the two apart.

Artifacts timed in different groups (a large model's sessions did not fit in memory at once: ``round_group``)
share no round, so their rounds are not paired: a one-sided Mann-Whitney rank test at the same level takes the
sign test's place (5 rounds against 11, four of them faster than every one of the other's: apart; pairing the
first 5 of each by index had called a 1.6x gap a tie).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

__all__ = ["MIN_ROUNDS_FOR_SIGN", "SIGN_LEVEL", "apart_by", "distinguishable", "rank_test_apart", "sign_test_allows"]

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
                    best_interval: Sequence[float] | None = None, *, paired: bool = True) -> bool:
    """Whether the benchmark says ``best`` is better than ``candidate`` (scores: lower is better, per round);
    ``paired``: the two were timed in the same rounds (else their rounds are two samples, ranked together)."""
    return bool(apart_by(candidate_rounds, best_rounds, candidate_interval, best_interval, paired=paired))


def apart_by(candidate_rounds: Sequence[float], best_rounds: Sequence[float],
             candidate_interval: Sequence[float] | None = None,
             best_interval: Sequence[float] | None = None, *, paired: bool = True) -> str:
    """The evidence that ``best`` is better, in words a report can print ('behind in 19 of 21 paired rounds (sign
    test, p = 0.0001)'); '' when the benchmark cannot tell the two apart."""
    if _disjoint(candidate_interval, best_interval):
        return "the 95% intervals do not overlap"
    if not paired:
        chance = _rank_chance(candidate_rounds, best_rounds)
        if chance is None or chance > SIGN_LEVEL:
            return ""
        return (f"its {len(candidate_rounds)} rounds rank above the other's {len(best_rounds)}, timed in another "
                f"group (rank test, p = {chance:.2g})")
    pairs = list(zip(candidate_rounds, best_rounds, strict=False))
    if len(pairs) < MIN_ROUNDS_FOR_SIGN:
        return ""
    disagree = sum(1 for mine, theirs in pairs if mine <= theirs)
    if disagree > max(sign_test_allows(len(pairs)), 0):
        return ""
    if sign_test_allows(len(pairs)) < 0:
        return f"behind in all {len(pairs)} paired rounds (too few for the sign test's 5% level)"
    chance = sum(math.comb(len(pairs), k) for k in range(disagree + 1)) / 2 ** len(pairs)
    return f"behind in {len(pairs) - disagree} of {len(pairs)} paired rounds (sign test, p = {chance:.2g})"


_EXACT_UP_TO = 1600
"""Round-count products up to which the rank test's distribution is counted exactly (a normal law beyond)."""


def rank_test_apart(candidate: Sequence[float], best: Sequence[float]) -> bool:
    """One-sided Mann-Whitney test at SIGN_LEVEL: are ``candidate``'s rounds higher than ``best``'s?  At least
    MIN_ROUNDS_FOR_SIGN rounds each; a tie between two values counts half (rounded down: the conservative side)."""
    chance = _rank_chance(candidate, best)
    return chance is not None and chance <= SIGN_LEVEL


def _rank_chance(candidate: Sequence[float], best: Sequence[float]) -> float | None:
    """The rank test's one-sided p-value; None with fewer than MIN_ROUNDS_FOR_SIGN rounds on either side."""
    n, m = len(candidate), len(best)
    if n < MIN_ROUNDS_FOR_SIGN or m < MIN_ROUNDS_FOR_SIGN:
        return None
    above = sum(1.0 if mine > theirs else 0.5 if mine == theirs else 0.0 for mine in candidate for theirs in best)
    return _upper_tail(n, m, math.floor(above))


def _upper_tail(n: int, m: int, u: int) -> float:
    """P(U >= u) when the n + m values are exchangeable (no difference), U counting pairs where the first is
    higher: exactly by counting arrangements, or by the normal law with a continuity correction for many rounds."""
    if n * m > _EXACT_UP_TO:
        mean, spread = n * m / 2, math.sqrt(n * m * (n + m + 1) / 12)
        return 0.5 * math.erfc((u - 0.5 - mean) / (spread * math.sqrt(2)))
    counts = _arrangements(n, m)
    return sum(counts[u:]) / math.comb(n + m, n)


def _arrangements(n: int, m: int) -> list[int]:
    """How many orderings of n + m distinct values give each U = 0 .. n m (the Gaussian binomial's coefficients)."""
    table = [[[1] for _ in range(m + 1)] for _ in range(n + 1)]
    for i in range(1, n + 1):
        for j in range(1, m + 1):
            # the largest value is one of the first group's (it beats all j of the others) or of the second's
            shifted = [0] * j + table[i - 1][j]
            other = table[i][j - 1]
            table[i][j] = [a + b for a, b in zip(shifted, other + [0] * (len(shifted) - len(other)), strict=True)]
    return table[n][m]
