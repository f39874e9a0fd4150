"""The budget's search over a ranking: the shortest prefix of it (most harmful candidates first) that holds.

``passes(count)`` says whether keeping the first ``count`` ranked candidates (or ladder steps) float holds the
tolerance; a longer prefix is assumed to hold when a shorter one does.  ``shortest_prefix`` gallops up from a
prefix known to fail (1, 2, 4... more), then bisects: ``O(log n)`` evaluations when few are needed;
``bisect`` alone between a failing and a passing count.  int8's search and fp16's emulated and per-target
searches both use them.
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["bisect", "shortest_prefix"]


def bisect(passes: Callable[[int], bool], failing: int, passing: int) -> int:
    """The shortest count in (``failing``, ``passing``] that passes, ``passing`` being known to pass."""
    while passing - failing > 1:
        middle = (failing + passing) // 2
        if passes(middle):
            passing = middle
        else:
            failing = middle
    return passing


def shortest_prefix(passes: Callable[[int], bool], failing: int, limit: int) -> tuple[int, int | None]:
    """(the longest count known to fail, the shortest that passes or None): galloping up from ``failing``, then
    bisection; ``limit`` is the longest count tried."""
    passing, step = None, 1
    while passing is None and failing + step < limit:
        if passes(failing + step):
            passing = failing + step
        else:
            failing, step = failing + step, 2 * step
    if passing is None:
        if limit <= failing or not passes(limit):
            return failing, None
        passing = limit
    passing = bisect(passes, failing, passing)
    return passing - 1, passing  # bisection ends with the two adjacent
