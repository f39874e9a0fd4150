"""The original model's own float noise: how far ONNX Runtime's optimisation levels move its outputs.

A model's outputs are only as exact as its arithmetic.  A recurrent model
(a decoder run as one Loop of hundreds of steps) carries every rounding
forward: ONNX Runtime's own graph rewrites (fused LayerNormalization, Gelu,
Conv+BatchNormalization, ...) move its outputs by far more than a fixed
tolerance allows, and a simplified model that rounds one step differently moves
them by as much.  So when the simplified model misses the configured
tolerance, the check measures the original against itself, ONNX Runtime with
every optimisation off (``ORT_DISABLE_ALL``) against the level the check runs
at, on the same inputs; the largest difference per output is that output's
noise floor, and the check allows ``max(check_atol, check_noise_factor x noise
floor)`` there.  An output the optimisation levels leave alone keeps the
configured tolerance.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

log = logging.getLogger(__name__)

NOISE_LEVEL = "ORT_DISABLE_ALL"
"""The optimisation level the original runs at to measure its noise floor (no rewrite at all)."""


def ort_session(model: str | bytes, level: str) -> Any:
    """An ONNX Runtime CPU session at the optimisation level named ``level`` (``GraphOptimizationLevel``)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, level)
    options.log_severity_level = 3
    return ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])


def ort_outputs(session: Any, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Every output of one run, by name."""
    names = [out.name for out in session.get_outputs()]
    return dict(zip(names, session.run(names, feeds), strict=True))


def noise_floor(original: Path,
                runs: Iterable[tuple[dict[str, np.ndarray], dict[str, np.ndarray]]]) -> dict[str, float]:
    """Output name -> the largest difference between ``runs``' outputs (the original at the check's level) and
    the original's outputs at ``NOISE_LEVEL`` on the same feeds; 0 for outputs that are not floats."""
    session = ort_session(str(original), NOISE_LEVEL)
    floor: dict[str, float] = {}
    for feeds, expected in runs:
        unoptimized = ort_outputs(session, feeds)
        for name, value in expected.items():
            floor[name] = max(floor.get(name, 0.0), spread(value, unoptimized.get(name)))
    log.info("simplify check: the original's noise floor between optimisation levels: %s", floor)
    return floor


def spread(expected: Any, actual: Any) -> float:
    """Largest absolute difference of the finite elements two float outputs share (sequences element-wise); 0
    where there is nothing to measure (other types, other shapes)."""
    import numpy as np

    if isinstance(expected, list) and isinstance(actual, list):
        return max((spread(e, a) for e, a in zip(expected, actual, strict=False)), default=0.0)
    if actual is None or isinstance(expected, list) or isinstance(actual, list):
        return 0.0
    expected, actual = np.asarray(expected), np.asarray(actual)
    if expected.dtype.kind != "f" or expected.shape != actual.shape or actual.dtype != expected.dtype:
        return 0.0
    ref, got = expected.astype(np.float64), actual.astype(np.float64)
    finite = np.isfinite(ref) & np.isfinite(got)
    value = float(np.abs(ref[finite] - got[finite]).max()) if finite.any() else 0.0
    return value if math.isfinite(value) else 0.0


def noise_bounds(floor: dict[str, float], atol: float, factor: float) -> dict[str, float]:
    """Output name -> the absolute tolerance the check allows there: ``max(atol, factor x noise floor)``."""
    return {name: max(atol, factor * value) for name, value in floor.items()}
