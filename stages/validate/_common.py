"""What the validate stage's modules share: feeds and outputs, one row's outcome, feeds cast to a model's types."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from qdeploy.calibration.readers import model_inputs
from qdeploy.core.rows import ValidationRow
from qdeploy.core.tolerance import Tolerance

__all__ = ["Feeds", "Outcome", "Outputs", "feed_caster", "worst_samples"]

Feeds = list[dict[str, np.ndarray]]
Outputs = list[Mapping[str, np.ndarray]]
"""Per sample, output name -> array: a dict, or a ``DiskSample`` that reads each array back from disk."""


@dataclass
class Outcome:
    """One validation row, and what the noise floor needs of it."""

    row: ValidationRow
    outputs: Outputs | None = None
    tolerance: Tolerance | None = None
    per_output: dict[str, Tolerance] = field(default_factory=dict)
    detections: dict[str, Any] | None = None
    """validate.detections as a dict (``qdeploy.core.detections``), when the recipe sets it."""


def feed_caster(model_path: Path) -> Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]:
    """A function giving a sample in the element types this model declares (an fp16 model may take float16)."""
    dtypes = {info.name: info.dtype for info in model_inputs(model_path)}

    def cast(feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {name: value.astype(dtypes.get(name, value.dtype), copy=False) for name, value in feed.items()}

    return cast


def worst_samples(reference: Outputs, candidate: Outputs, count: int) -> list[int]:
    """Indices of the samples that disagree most: NaN/Inf first, then the largest error relative to |ref|."""
    scores = []
    for index, (ref, cand) in enumerate(zip(reference, candidate, strict=False)):
        nonfinite, relative = 0, 0.0
        for name, r in ref.items():
            c = cand.get(name)
            if c is None or np.shape(c) != np.shape(r) or np.asarray(r).dtype.kind != "f":
                continue
            r64, c64 = np.asarray(r, np.float64), np.asarray(c, np.float64)
            nonfinite += int(np.count_nonzero(~np.isfinite(c64)))
            finite = np.isfinite(r64) & np.isfinite(c64)
            if finite.any():
                scale = float(np.abs(r64[finite]).max()) or 1.0
                relative = max(relative, float(np.abs(c64[finite] - r64[finite]).max()) / scale)
        scores.append((nonfinite, relative, -index))
    ranked = sorted(range(len(scores)), key=lambda i: scores[i], reverse=True)
    return sorted(ranked[:count])
