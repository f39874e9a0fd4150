"""The one way stages read a dataset: ``iter_samples`` picks the reader its spec names (npy, images, text,
random)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from qdeploy.calibration.images import image_samples
from qdeploy.calibration.readers import (
    DEFAULT_RANDOM_SAMPLES,
    InputInfo,
    Ranges,
    inputs_of,
    npy_samples,
    random_samples,
)
from qdeploy.calibration.text import text_samples
from qdeploy.core.onnx_wire import load_model
from qdeploy.graph.integer_inputs import safe_integer_ranges

if TYPE_CHECKING:

    from qdeploy.calibration.spec import DatasetSpec

__all__ = ["iter_samples"]


def iter_samples(spec: DatasetSpec | None, model_path: Path, *, resolve: Callable[[str], Path] = Path,
                 ranges: Mapping[str, tuple[float | None, float | None]] | None = None, limit: int | None = None,
                 dataset_name: str | None = None,
                 frozen: Mapping[str, np.ndarray] | None = None) -> Iterator[dict[str, np.ndarray]]:
    """Feeds from a dataset (its path resolved by ``resolve``), or seeded random data shaped from the model when
    spec is None (``ranges``: input name -> (low, high) of the random values).  Feeds hold the model's inputs
    only: an input the recipe froze (``frozen``: name -> value) is no longer one, and a sample that holds it at
    another value is refused (it was recorded for another model)."""
    if spec is not None and spec.reader == "text":  # fills every input itself, from the model's declared dims
        yield from text_samples(spec, model_path, resolve=resolve, limit=limit, dataset_name=dataset_name or "")
        return
    ranges = dict(ranges or {})
    seeded = spec is None or spec.reader == "random"
    inputs, graph_ranges = _inputs_and_ranges(model_path, ranges if seeded else None)
    if seeded:
        count = (spec.samples if spec and spec.samples else DEFAULT_RANDOM_SAMPLES)
        count = min(count, limit) if limit else count
        ranges = {**graph_ranges, **ranges}  # the recipe's low/high win
        yield from random_samples(inputs, count, seed=spec.seed if spec else 0, ranges=ranges)
        return
    folder = resolve(spec.path or "")
    count = min(filter(None, (spec.samples, limit)), default=None)
    if spec.reader == "images":
        yield from image_samples(folder, inputs, spec, limit=count, dataset_name=dataset_name or "")
        return
    yield from npy_samples(folder, inputs, limit=count, dataset_name=dataset_name or "", frozen=frozen)


def _inputs_and_ranges(model_path: Path, declared: Mapping[str, tuple[float | None, float | None]] | None,
                       ) -> tuple[list[InputInfo], Ranges]:
    """The model's inputs and, for random data (``declared`` given), safe ranges of the integer inputs the recipe
    gives none for, read from what the graph does with them (an index into a 4-row table takes [0, 4), not
    [0, 100)).  The graph is read once and not held while samples are made."""
    model = load_model(model_path, load_external_data=False)
    inputs = inputs_of(model)
    if declared is None or not any(np.issubdtype(info.dtype, np.integer) and info.name not in declared
                                   for info in inputs):
        return inputs, {}
    return inputs, safe_integer_ranges(model)
