"""The contract between the runner and the stages.

A transform stage is ``run(artifact: Artifact, config: <Config>, ctx: StageContext) -> StageResult``.
It reads its input from ``artifact.path`` and returns the new model; the runner
writes it atomically, records the sidecar and caches it.
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from qdeploy.core.findings import Findings
from qdeploy.core.onnx_wire import load_model

if TYPE_CHECKING:
    import numpy as np
    import onnx

__all__ = ["Artifact", "DatasetInfo", "InputRanges", "SampleReader", "StageContext", "StageResult",
           "artifact_precision", "weight_only_graph"]

log = logging.getLogger(__name__)


def artifact_precision(stages: tuple[str, ...] | list[str], path: Path | None = None) -> str:
    """The precision a chain of stages produces: int4, int8, fp16 or fp32.

    A quantized artifact is int4 when its weights are 4-bit (weight-only MatMulNBits/GatherBlockQuantized with
    ``bits`` 4, or a DequantizeLinear of int4/uint4 weights); telling that needs the file (``path``): without
    it, quantized reads int8.  A model that arrived in float16 (most of its float weights float16: a PyTorch
    ``.half()`` export) is fp16 without the fp16 stage, which is also what its file says."""
    if "quantize" in stages:
        return "int4" if path is not None and _four_bit_weights(path) else "int8"
    if "fp16" in stages or (path is not None and _weight_facts(path).float16):
        return "fp16"
    return "fp32"


_FOUR_BIT_OPS = frozenset({"MatMulNBits", "GatherBlockQuantized", "MatMulBnb4"})


_ACTIVATION_QUANT_OPS = frozenset({"QuantizeLinear", "DynamicQuantizeLinear", "QLinearConv", "QLinearMatMul",
                                   "MatMulInteger", "ConvInteger", "DynamicQuantizeMatMul", "QGemm"})


@dataclass(frozen=True)
class _WeightFacts:
    four_bit: bool = False
    weight_only: bool = False
    """Quantized weights (blocked ops, or DequantizeLinear of initializers) and no quantized activation."""
    float16: bool = False
    """More float16 weight elements than float32 ones (initializers)."""


def _four_bit_weights(path: Path) -> bool:
    return _weight_facts(path).four_bit


def weight_only_graph(path: Path) -> bool:
    """Whether the model at ``path`` quantizes weights only: its activations stay float (reads the graph only)."""
    return _weight_facts(path).weight_only


def _weight_facts(path: Path) -> _WeightFacts:
    try:
        stat = path.stat()
    except OSError:
        return _WeightFacts()
    return _weight_facts_cached(str(path), stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=64)
def _weight_facts_cached(path: str, mtime_ns: int, size: int) -> _WeightFacts:
    """What the graph's quantized weights are; reads the graph only (the weights stay on disk)."""
    from onnx import TensorProto

    try:
        graph = load_model(Path(path), load_external_data=False).graph
    except Exception as exc:  # the runtimes will say what is wrong with the file
        log.debug("cannot read %s for its weight bits: %s", path, exc)
        return _WeightFacts()
    four_bit_types = {TensorProto.INT4, TensorProto.UINT4}
    types: dict[str, int] = {}
    elements = {TensorProto.FLOAT16: 0, TensorProto.FLOAT: 0}
    widened = _widened_to_float(graph)
    for init in graph.initializer:
        types[init.name] = init.data_type
        if init.data_type in elements:  # a float16 weight only ever cast to float32 is computed in float32
            elements[TensorProto.FLOAT if init.name in widened else init.data_type] += math.prod(init.dims)
    four_bit = quantized_weights = quantized_activations = False
    for node in graph.node:
        if node.op_type in _FOUR_BIT_OPS:
            quantized_weights = True
            four_bit |= next((attr.i for attr in node.attribute if attr.name == "bits"), 4) == 4  # both default 4
        elif node.op_type == "DequantizeLinear" and node.input[0] in types:
            quantized_weights = True
            four_bit |= types[node.input[0]] in four_bit_types
        elif node.op_type in _ACTIVATION_QUANT_OPS:
            quantized_activations = True
    return _WeightFacts(four_bit, quantized_weights and not quantized_activations,
                        elements[TensorProto.FLOAT16] > elements[TensorProto.FLOAT])


def _widened_to_float(graph: onnx.GraphProto) -> set[str]:
    """Tensors every reader of which is a Cast to float32 (weights stored narrow: simplify keeps them so)."""
    casts: dict[str, bool] = {}
    for node in graph.node:
        widens = node.op_type == "Cast" and any(attr.name == "to" and attr.i == 1 for attr in node.attribute)
        for name in node.input:
            casts[name] = casts.get(name, True) and widens
    outputs = {value.name for value in graph.output}
    return {name for name, only in casts.items() if only and name not in outputs}


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
    at_device_default: bool = False
    """Evaluate this float32 artifact at the device's default precision instead of pinned to float32 (the
    ``fp32@default`` row, ``qdeploy.core.runtimes.device_default_name``)."""
    pinned_f32: bool = False
    """Evaluate this weight-only artifact with INFERENCE_PRECISION_HINT f32 on OpenVINO instead of at the device's
    default (the ``int4@f32`` row, ``qdeploy.core.runtimes.pinned_f32_name``)."""

    @property
    def precision(self) -> str:
        return artifact_precision(self.stages, self.path)

    @property
    def weight_only(self) -> bool:
        """Quantized weights, float activations (``weight_only_graph``)."""
        return "quantize" in self.stages and weight_only_graph(self.path)

    def load(self, *, load_external_data: bool = True) -> onnx.ModelProto:
        """The model; without ``load_external_data``, large weights stay references into the files
        (``qdeploy.core.onnx_wire``: a one-file model's too, so that reading its graph costs no weights)."""
        return load_model(self.path, load_external_data=load_external_data)


@dataclass
class StageResult:
    """What a transform stage did: the new model, whether it changed, its findings."""

    model: onnx.ModelProto
    changed: bool = True
    findings: Findings = field(default_factory=Findings)
    """The stage's typed findings (the stage's own model of ``qdeploy.core.findings.Findings``)."""
    path: Path | None = None
    """Where ``model`` is already saved with its external data (large models: the proto holds no weights)."""
    guard: dict[str, Any] | None = None
    """What the runner's last check verified (``qdeploy.pipeline.run.guard``); the report lists it in the findings."""

    def report(self) -> dict[str, Any]:
        """The findings as report.json and the sidecar hold them, the guard's record included."""
        found = self.findings.to_report()
        return found if self.guard is None else {**found, "guard": self.guard}

    def unchecked(self) -> str | None:
        """Why the stage's own comparison did not run; None when it ran or the stage has none."""
        return self.findings.unchecked()


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
    measure on.  The runner puts it into the cache key of stages that read it (qdeploy.pipeline.recipe.registry)."""
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
    cache_dir: Path | None = None
    """A folder shared by the run's variants (and later runs): a stage's reusable intermediate results, each
    keyed by a hash of what it was computed from and verified before reuse; None: nothing is shared."""
    sample_reader: SampleReader | None = None
    """Reads a dataset's feeds; None: this context has no data (``samples`` says so)."""
    detections: Mapping[str, Any] | None = None
    """validate.detections as a dict: a detector's outputs, which a stage's own comparisons (an accuracy budget)
    match by IoU as validation does (``qdeploy.core.detections``); None when the recipe sets none."""

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
