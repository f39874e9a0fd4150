"""Tiny value helpers every layer shares: finite checks and one-line messages.

One copy each, at the bottom layer, so the report, the gates and the stages agree on what counts as a number
and how long a quoted error may be.
"""

from __future__ import annotations

import math
import re
from typing import Any

__all__ = ["finite_or", "is_finite_number", "one_line", "utf8_safe"]

_SURROGATE = re.compile("[\ud800-\udfff]")


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


def _escaped(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code - 0xDC00:02x}" if 0xDC80 <= code <= 0xDCFF else f"\\u{code:04x}"


def utf8_safe(text: str) -> str:
    """``text`` with every lone surrogate written as an escape: the bytes of a file name that is not UTF-8 (which
    Python decodes as surrogates, ``os.fsdecode``) become ``\\xff``, as ``ls -b`` shows them, so that text holding
    such a path can be written as UTF-8."""
    return _SURROGATE.sub(_escaped, text)
