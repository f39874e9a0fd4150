"""One number formatter for the reports, two styles: the old ``view.fmt`` and ``format.fmt_number`` as one."""

from __future__ import annotations

import math

import pytest

from qdeploy.pipeline.report.format import escape_html, fmt_number


@pytest.mark.parametrize(("value", "measure", "value_style"), [
    (None, "–", "–"),
    (4.0, "4.00", "4"),                       # a measurement keeps its significant zeros; a value reads short
    (0.512345, "0.512", "0.512"),
    (1234.5, "1234", "1234"),
    (1.00048, "1.00", "1.00048"),
    (0.9999999, "1.00", "0.9999999"),         # a value near 1 gets the digits that tell it from 1
    (2_500_000.0, "2.50e+06", "2.500e+06"),
    (7, "7", "7"),
    (12_345_678, "1.23e+07", "12345678"),     # a value's integer stays whole
    (True, "True", "yes"),
    (math.nan, "NaN", "NaN"),
    (-math.inf, "-∞", "-∞"),
    ("n/a", "n/a", "n/a"),
])
def test_the_two_styles_of_the_one_formatter(value: object, measure: str, value_style: str) -> None:
    assert fmt_number(value) == measure
    assert fmt_number(value, style="value") == value_style


def test_digits_apply_to_both_styles() -> None:
    assert fmt_number(0.123456, 4) == "0.1235" and fmt_number(0.123456, 4, style="value") == "0.1235"
    assert fmt_number(1.5, 4) == "1.500" and fmt_number(1.5, 4, style="value") == "1.5"


def test_escape_html_quotes_attributes_too() -> None:
    assert escape_html('<a href="x">&') == "&lt;a href=&quot;x&quot;&gt;&amp;"
    assert escape_html(3) == "3"
