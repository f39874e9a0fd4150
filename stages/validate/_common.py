"""What the validate stage's modules share: feeds and outputs, one row's outcome, feeds cast to a model's types."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from qdeploy.calibration.readers import model_inputs
from qdeploy.core.rows import ValidationRow
from qdeploy.core.tolerance import Tolerance

__all__ = ["Feeds", "Outcome", "Outputs", "feed_caster"]

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


def feed_caster(model_path: Path) -> Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]:
    """A function giving a sample in the element types this model declares (an fp16 model may take float16)."""
    dtypes = {info.name: info.dtype for info in model_inputs(model_path)}

    def cast(feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {name: value.astype(dtypes.get(name, value.dtype), copy=False) for name, value in feed.items()}

    return cast
