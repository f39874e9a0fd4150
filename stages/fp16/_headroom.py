"""Headroom: the stricter target the fp16 stage's own check and repair aim at, above the verdict's tolerance.

The stage judges float16 on a few calibration samples, emulated (float32 arithmetic, float16 storage); the
artifact is then validated on other samples, under true float16 arithmetic too (``reference:cpu``). Two gaps
lie between them, and both are largest exactly where a model is marginal:

- the draw: when an output's energy sits in a few elements (a sigmoid's tail, an Exp), an absolute float16
  error upstream becomes a relative error of those few elements, and which elements they are changes with the
  draw. On PP-OCRv4 det fed uniform noise at 192x192, the same artifact scored 30.7 dB on its 4 calibration
  draws (emulated) and 17 to 31 dB on 5 others under true float16;
- the arithmetic: float16 accumulation and intermediate rounding inside ops, which the emulation does not do.

A check that passes by less than the headroom (pooled, or on any one sample: ``_draws``) therefore does not
show that the artifact holds; the repair runs and keeps float32 the fewest further nodes that meet the stricter
target on every sample. The verdict itself (``fidelity.emulated.passed``) stays on the tolerance as written.
"""

from __future__ import annotations

from typing import TypedDict

from qdeploy.core.tolerance import Tolerance

__all__ = ["HeadroomRecord", "headroom_findings", "with_headroom"]


class HeadroomRecord(TypedDict):
    """The sidecar's headroom (``fidelity.emulated.headroom``): its size, the stricter target, whether the pool and
    every sample met it, and each sample's own SNR."""

    db: float
    target: dict[str, float]
    met: bool
    sample_snr_db: list[float | None]


def with_headroom(tolerance: Tolerance, db: float) -> Tolerance:
    """``tolerance`` made ``db`` decibels stricter in error power.

    snr_db_min rises by db; the cosine's distance from 1 (which, for small errors, is half the noise-to-signal
    power ratio) shrinks by the same power ratio; atol and rtol (amplitudes) by its square root. Top-1
    agreement is not an error power and stays as it is.
    """
    if db <= 0:
        return tolerance
    power, amplitude = 10.0 ** (-db / 10.0), 10.0 ** (-db / 20.0)
    updates: dict[str, float] = {}
    if tolerance.snr_db_min is not None:
        updates["snr_db_min"] = tolerance.snr_db_min + db
    if tolerance.cosine_min is not None and tolerance.cosine_min < 1.0:
        updates["cosine_min"] = 1.0 - (1.0 - tolerance.cosine_min) * power
    if tolerance.atol is not None:
        updates["atol"] = tolerance.atol * amplitude
    if tolerance.rtol is not None:
        updates["rtol"] = tolerance.rtol * amplitude
    return tolerance.model_copy(update=updates)


def headroom_findings(db: float, target: Tolerance, met: bool, sample_snr_db: list[float | None]) -> HeadroomRecord:
    """What the sidecar says about the headroom: its size, the stricter target, whether the pool and every sample
    met it, and each sample's own SNR."""
    return {"db": db, "target": target.model_dump(exclude_none=True), "met": met, "sample_snr_db": sample_snr_db}
