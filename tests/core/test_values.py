"""The shared value helpers: one finite check (the gates' copy took a bool for a number), one clamp to finite."""

from __future__ import annotations

import math

from qdeploy.core.values import finite_or, is_finite_number, one_line


def test_a_finite_number_is_an_int_or_float_that_is_not_a_bool() -> None:
    assert is_finite_number(3) and is_finite_number(0.5) and is_finite_number(-1e300)
    assert not is_finite_number(True)  # pipeline/results/gates.py's copy said True: a bool p50 passed as measured
    assert not any(is_finite_number(value) for value in (math.nan, math.inf, -math.inf, None, "3", [1.0]))


def test_finite_or_stands_in_only_for_nan_and_infinity() -> None:
    assert finite_or(2.5, 0.0) == 2.5
    assert finite_or(math.inf, 1e9) == 1e9 and finite_or(math.nan, -1.0) == -1.0


def test_one_line_folds_white_space_and_cuts_at_the_limit() -> None:
    assert one_line(ValueError("a\n  b\tc")) == "a b c"
    assert one_line("x" * 10, limit=4) == "xxxx..."
    assert one_line("x" * 4, limit=4) == "xxxx"
