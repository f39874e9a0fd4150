"""The contract between the runner and the stages.

A transform stage is ``run(artifact: Artifact, config: <Config>, ctx: StageContext) -> StageResult``.
It reads its input from ``artifact.path`` and returns the new model; the runner
writes it atomically, records the sidecar and caches it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import numpy as np
    import onnx

__all__ = ["Artifact", "DatasetInfo", "InputRanges", "SampleReader", "StageContext", "StageResult",
           "artifact_precision"]

log = logging.getLogger(__name__)


def artifact_precision(stages: tuple[str, ...] | list[str]) -> str:
    """The precision a chain of stages produces: int8, fp16 or fp32."""
    if "quantize" in stages:
        return "int8"
    if "fp16" in stages:
        return "fp16"
    return "fp32"


@dataclass(frozen=True)
class Artifact:
    """An ONNX file on disk (external data beside it) plus its sidecar JSON."""

    path: Path
    sidecar: Path
    key: str
    """Cache key that produced it (the content address)."""
    sha256: str
    """The model file's own sha256 (what ``sha256sum`` prints)."""
    size_bytes: int
    """Model file plus external data."""
    stages: tuple[str, ...]
    parent: str | None
    cached: bool = False
    seconds: float = 0.0
    external_data: tuple[tuple[str, str, int], ...] = ()
    """(file name, sha256, size in bytes) of each external data file beside ``path``."""

    @property
    def precision(self) -> str:
        return artifact_precision(self.stages)

    def load(self, *, load_external_data: bool = True) -> onnx.ModelProto:
        """The model; without ``load_external_data``, large weights stay references into the files
        (``qdeploy.core.onnx_wire``: a one-file model's too, so that reading its graph costs no weights)."""
        from qdeploy.core.onnx_wire import load_model

        return load_model(self.path, load_external_data=load_external_data)


@dataclass
class StageResult:
    """What a transform stage did: the new model, whether it changed, its findings."""

    model: onnx.ModelProto
    changed: bool = True
    findings: dict[str, Any] = field(default_factory=dict)
    path: Path | None = None
    """Where ``model`` is already saved with its external data (large models: the proto holds no weights)."""


class DatasetInfo(Protocol):
    """What a stage may read of a named dataset (``qdeploy.calibration.spec.DatasetSpec`` is one)."""

    reader: str
    path: str | None
    samples: int | None


SampleReader = Callable[..., Iterator[dict[str, "np.ndarray"]]]
"""``(spec | None, model_path, *, resolve, ranges, limit, dataset_name) -> feeds``:
``qdeploy.calibration.samples.iter_samples``."""
InputRanges = Mapping[str, tuple[float | None, float | None]]


@dataclass
class StageContext:
    """What a stage may use of the run: its datasets, a path resolver, a scratch folder (never the recipe).

    The pipeline builds it from the recipe (``Recipe.stage_context``); tests build it with
    ``qdeploy.calibration.data_context``.
    """

    variant: str
    work_dir: Path
    """A scratch folder of this stage run; emptied afterwards."""
    on_progress: Callable[[str], None] = field(default=lambda message: None)
    """Tell the progress display what is being worked on (a short phrase)."""
    targets: tuple[str, ...] = ()
    """The targets the artifact is built for (the recipe's); empty when unknown."""
    default_dataset: str | None = None
    """The run's default dataset (the recipe's validate.data): what a stage whose config names no data may
    measure on.  The runner puts it into the cache key of stages that read it (qdeploy.pipeline.registry)."""
    datasets: Mapping[str, DatasetInfo] = field(default_factory=dict)
    """The recipe's named datasets."""
    input_ranges: InputRanges = field(default_factory=dict)
    """Input name -> (low, high) the recipe declares for seeded random values (model.inputs)."""
    reference_variant: str | None = None
    """The variant the others are compared with."""
    batch_sizes: tuple[int, ...] = ()
    """The batch sizes the run benchmarks (empty when it benchmarks nothing): validation covers them too."""
    resolver: Callable[[str], Path] = Path
    """A path of the recipe (relative to the recipe file) -> where it is."""
    sample_reader: SampleReader | None = None
    """Reads a dataset's feeds; None: this context has no data (``samples`` says so)."""

    def resolve(self, relative: str) -> Path:
        return self.resolver(relative)

    def samples(self, dataset: str | None, model_path: Path,
                limit: int | None = None) -> Iterator[dict[str, np.ndarray]]:
        """Stream feeds (input name -> array) from a named dataset, or seeded random data when None."""
        if self.sample_reader is None:
            raise RuntimeError("this stage context reads no data (build it with qdeploy.calibration.data_context)")
        if dataset is not None and dataset not in self.datasets:
            raise KeyError(f"unknown dataset '{dataset}'; the recipe's datasets: {sorted(self.datasets)}")
        spec = self.datasets[dataset] if dataset is not None else None
        return self.sample_reader(spec, model_path, resolve=self.resolve, ranges=self.input_ranges, limit=limit,
                                  dataset_name=dataset)
