"""Tiny value helpers every layer shares: finite checks and one-line messages.

One copy each, at the bottom layer, so the report, the gates and the stages agree on what counts as a number
and how long a quoted error may be.
"""

from __future__ import annotations

import math
from typing import Any

__all__ = ["finite_or", "is_finite_number", "one_line"]


def is_finite_number(value: Any) -> bool:
    """An int or float that is neither NaN nor infinite; a bool is not a number here (``True`` is an int)."""
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def finite_or(value: float, substitute: float) -> float:
    """``value`` when finite, else ``substitute`` (JSON has no inf; a sort key must not be NaN)."""
    return value if math.isfinite(value) else substitute


def one_line(exc: BaseException | str, limit: int = 300) -> str:
    """An exception's message on one line (white space folded), cut to ``limit`` characters with '...'."""
    text = " ".join(str(exc).split())
    return text if len(text) <= limit else text[:limit] + "..."
