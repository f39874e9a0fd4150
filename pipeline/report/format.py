"""Numbers and text for people, each quantity to the precision its measurement supports; one formatter.

``fmt_number`` writes a measurement to its significant digits (``style="measure"``: a latency to 3 significant
digits, "4.00", never "1.00048x") or a recorded value as short as it reads (``style="value"``: findings and gate
values, "4", "yes", widened near 1 so a cosine of 0.9999999 does not read as 1).  The others say what each
quantity is: a speedup to 2 decimals (``≈1x`` when its interleaved rounds disagree on which is faster), a rate to
3 significant digits, an SNR to 0.1 dB (the 200 dB cap reads "identical outputs"), a size in MB.
``escape_html`` is the one HTML escape of the report pages.
"""

from __future__ import annotations

import html
import math
from typing import Any, Literal

from qdeploy.core.compare import SNR_CAP_DB  # identical outputs report this; it is not a measurement
from qdeploy.core.values import is_finite_number

__all__ = ["escape_html", "fmt_cosine", "fmt_cosine_cell", "fmt_fidelity", "fmt_mb", "fmt_ms", "fmt_number",
           "fmt_rate", "fmt_snr", "fmt_snr_cell", "fmt_speedup", "straddles_one"]


def fmt_number(value: Any, significant: int = 3, *, style: Literal["measure", "value"] = "measure") -> str:
    """A number for people; '–' for nothing, NaN and ±∞ by name, anything else not a number as its text.

    ``measure``: a measurement to ``significant`` digits, zeros kept: 10.3, 4.00, 0.512, 1234 (never 1.00048).
    ``value``: a value as recorded, as short as it reads: 4, 0.5, integers whole, a bool as yes/no, and more
    digits near 1 (a cosine of 0.9999999 must not read as 1).
    """
    if value is None:
        return "–"
    if isinstance(value, bool):
        return ("yes" if value else "no") if style == "value" else str(value)
    if not isinstance(value, int | float) or (style == "value" and isinstance(value, int)):
        return str(value)
    if not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("∞" if value > 0 else "-∞")
    return _measure(value, significant) if style == "measure" else _value(value, significant)


def _measure(value: float, significant: int) -> str:
    if value == 0:
        return "0"
    if 10 ** significant <= abs(value) < 1e6 or (isinstance(value, int) and abs(value) < 1e6):
        return f"{value:.0f}"
    text = f"{value:#.{significant}g}"
    return text.rstrip(".") if "e" not in text else f"{value:.{significant - 1}e}"


def _value(value: float, digits: int) -> str:
    if 1e3 <= abs(value) < 1e6:
        return f"{value:.0f}"
    if 0.0 < abs(1.0 - value) < 10.0 ** -digits:  # a cosine of 0.9999999 must not read as 1
        digits = min(9, 2 - math.floor(math.log10(abs(1.0 - value))))
    return f"{value:.{digits}g}" if abs(value) < 1e6 else f"{value:.3e}"


def escape_html(value: Any) -> str:
    """Any value as text safe inside an HTML element or a quoted attribute."""
    return html.escape(str(value), quote=True)


def fmt_ms(value: Any) -> str:
    """A latency: '6.80 ms'."""
    return "–" if not is_finite_number(value) else f"{fmt_number(value)} ms"


def fmt_rate(value: Any) -> str:
    """Inferences per second: '470 inf/s'."""
    return "–" if not is_finite_number(value) else f"{fmt_number(value)} inf/s"


def fmt_mb(size_bytes: Any) -> str:
    """A file size in MB: '0.495 MB'."""
    return "–" if not is_finite_number(size_bytes) else f"{fmt_number(size_bytes / 1e6)} MB"


def fmt_speedup(value: Any, low_high: list[float] | None = None) -> str:
    """A ratio to two decimals, '2.02x'; '≈1x (0.78–1.09)' when the per-round ratios straddle 1."""
    if not is_finite_number(value):
        return "–"
    if straddles_one(low_high):
        assert low_high is not None
        return f"≈1x ({low_high[0]:.2f}–{low_high[1]:.2f})"
    return f"{value:.2f}x"


def straddles_one(low_high: list[float] | None) -> bool:
    """The rounds disagree on which of two artifacts is faster."""
    return bool(low_high) and low_high[0] < 1.0 < low_high[1]  # type: ignore[index]


def fmt_cosine(value: Any) -> str:
    """As many decimals as tell a cosine from 1: 0.998, 0.999997, 1."""
    if not is_finite_number(value):
        return "–"
    gap = 1.0 - value
    if gap <= 0:
        return "1"
    if gap < 1e-9:  # more digits than anyone reads: say how far from 1
        return f"1 − {gap:.1g}"
    digits = 3 if gap >= 1e-3 else min(9, 1 - math.floor(math.log10(gap)))
    return f"{value:.{digits}f}"


def fmt_cosine_cell(metrics: Any) -> str:
    """The cosine column of a row: its cosine, or for a detector compared by matching boxes (no output of it has a
    cosine) the share of boxes matched ('97.4% boxes')."""
    if metrics.cosine is None and is_finite_number(metrics.detections_matched):
        return f"{metrics.detections_matched:.1%} boxes"
    return fmt_cosine(metrics.cosine)


def fmt_snr(value: Any) -> str:
    """An SNR to 0.1 dB; at the cap, 'identical outputs' (the cap is not a measurement)."""
    if not is_finite_number(value):
        return "–" if value is None else fmt_number(value)
    return "identical outputs" if value >= SNR_CAP_DB else f"{value:.1f} dB"


def fmt_snr_cell(value: Any) -> str:
    """An SNR in a column headed 'SNR dB' (report.md, report.html and the terminal alike): '25.2', 'identical
    outputs' at the cap, '–' for nothing."""
    return fmt_snr(value).removesuffix(" dB")


def fmt_fidelity(fidelity: dict[str, Any]) -> str:
    """Task metric, cosine and SNR of one artifact on one target, those measured."""
    parts = []
    if is_finite_number(fidelity.get("task_metric")):
        parts.append(f"task metric {fmt_number(fidelity['task_metric'], 4)}")
    if is_finite_number(fidelity.get("detections_matched")):
        parts.append(f"detections matched {fidelity['detections_matched']:.1%}")
    if is_finite_number(fidelity.get("cosine")):
        parts.append(f"cosine {fmt_cosine(fidelity['cosine'])}")
    if is_finite_number(fidelity.get("snr_db")):
        snr = fmt_snr(fidelity["snr_db"])
        parts.append(snr if snr == "identical outputs" else f"SNR {snr}")
    return ", ".join(parts) or "fidelity not measured"
