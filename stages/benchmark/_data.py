"""What the benchmark feeds, and what it says when a row cannot be measured.

Benchmarks run on the recipe's data, not on guesses from declared shapes: random arrays shaped from the
declarations break real models (token-type ids drawn from [0, 100) overflow a 2-row embedding; a dynamic
width set to 1 is smaller than a pooling window).  The dataset is ``benchmark.data``, else
``validate.data``, else the first dataset of the recipe that reads real samples; its samples are stacked to
each batch size (qdeploy.calibration.batches).  Only a recipe without data gets seeded random inputs; an integer
input without ``low``/``high`` in ``model.inputs`` then takes what the graph makes of it (qdeploy.graph.
integer_inputs): [0, rows) where it indexes a constant table, [1, 4) where it becomes a size, a count or a shape
(zeros there would time empty tensors or a Loop that never runs), and zeros, a value valid for any index, where
the graph does not say.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

import numpy as np

from qdeploy.calibration.batches import (
    Batch,
    BatchError,
    available_memory_bytes,
    batch_axes,
    explain_batch_failure,
    make_batch,
)
from qdeploy.calibration.readers import inputs_of, model_inputs, random_samples
from qdeploy.core.onnx_wire import load_model
from qdeploy.graph.integer_inputs import SIZE_HIGH, safe_integer_ranges
from qdeploy.targets import short_message

if TYPE_CHECKING:
    from qdeploy.core.context import StageContext

MAX_SAMPLES = 64
"""Distinct samples read for benchmarks at most; larger batches cycle through them (latency does not care)."""
MEMORY_SHARE = 0.5
"""Share of the available memory a batch's inputs may take."""
ZEROS_NOTE = ("integer input '{name}' fed zeros: the recipe has no data, model.inputs gives it no low/high and the "
              "graph does not say what it is; latency may differ on real values")
GRAPH_RANGE_NOTE = ("integer input '{name}' fed seeded random values in [{low}, {high}), read from the graph ({what}): "
                    "the recipe has no data and model.inputs gives it no low/high; latency may differ on real values")


@dataclass
class BenchData:
    """The samples every artifact of one benchmark run is fed, and where they came from."""

    samples: list[dict[str, np.ndarray]]
    source: str
    random: bool
    notes: list[str] = field(default_factory=list)

    def batch_for(self, model_path: Path, batch: int) -> Batch:
        """A feed of `batch` rows in the element types this artifact declares; BatchError when it cannot be."""
        dtypes = {info.name: info.dtype for info in model_inputs(model_path)}
        memory = available_memory_bytes()
        built = make_batch(self.samples, batch_axes(model_path), batch,
                           max_bytes=int(memory * MEMORY_SHARE) if memory else None)
        built.feed = {name: value.astype(dtypes.get(name, value.dtype), copy=False)
                      for name, value in built.feed.items()}
        built.info = {"source": self.source, **built.info, "notes": list(self.notes)}
        return built


def dataset_for(ctx: StageContext, requested: str | None) -> tuple[str | None, str]:
    """The dataset benchmarks read (None: random data) and why that one."""
    named = requested or ctx.default_dataset
    if named is not None:
        field_name = "benchmark.data" if requested else "validate.data"
        if ctx.datasets[named].reader == "random":
            return None, f"seeded random data (dataset '{named}' of {field_name} has reader random)"
        return named, f"dataset '{named}' ({field_name})"
    for name, spec in ctx.datasets.items():
        if spec.reader != "random":
            return name, f"dataset '{name}' (the recipe's first dataset of real samples; validate.data is not set)"
    return None, "seeded random data: the recipe has no dataset of real samples"


def read_data(ctx: StageContext, requested: str | None, model_path: Path, batch_sizes: list[int]) -> BenchData:
    """The samples for every batch size of the run, read once against the first artifact's inputs."""
    dataset, source = dataset_for(ctx, requested)
    limit = min(max(batch_sizes), MAX_SAMPLES)
    if dataset is not None:
        return BenchData(list(ctx.samples(dataset, model_path, limit=limit)), source, False)
    return _random_data(ctx, model_path, source, limit)


def _random_data(ctx: StageContext, model_path: Path, source: str, count: int) -> BenchData:
    model = load_model(model_path, load_external_data=False)
    inputs = inputs_of(model)
    declared = dict(ctx.input_ranges)
    from_graph = {name: span for name, span in safe_integer_ranges(model, unknown=None).items()
                  if not any(bound is not None for bound in declared.get(name, (None, None)))}
    del model  # the graph is not held while samples are made
    samples = list(random_samples(inputs, count, seed=0, ranges={**declared, **from_graph}))
    notes = []
    for info in inputs:
        bounded = any(bound is not None for bound in declared.get(info.name, (None, None)))
        if info.name in from_graph:
            low, high = from_graph[info.name]
            is_size = (low, high) == (1, SIZE_HIGH)
            what = "a size, a count or a shape" if is_size else f"an index into a table of {high} rows"
            notes.append(GRAPH_RANGE_NOTE.format(name=info.name, low=low, high=high, what=what))
        elif np.issubdtype(info.dtype, np.integer) and not bounded:
            for sample in samples:
                sample[info.name] = np.zeros_like(sample[info.name])
            notes.append(ZEROS_NOTE.format(name=info.name))
        dynamic = [axis for axis, dim in enumerate(info.shape) if dim is None and axis > 0]
        if dynamic:
            notes.append(f"input '{info.name}': dynamic axes {dynamic} set to 1 in random data; give the recipe "
                         "a dataset (validate.data) to benchmark real sizes")
    return BenchData(samples, source, True, notes)


class ShapeMismatch(TypedDict):
    """An output whose real shape contradicts its declaration (a row's ``output_shapes``): "?" for a symbolic or
    unknown declared dimension."""

    declared: list[int | str]
    actual: list[int]


def output_shape_notes(model_path: Path,
                       outputs: dict[str, np.ndarray]) -> tuple[dict[str, ShapeMismatch], list[str]]:
    """Outputs whose real shape contradicts the declared one (rank, or a static dimension), and notes on them."""

    model = load_model(model_path, load_external_data=False)
    mismatches: dict[str, ShapeMismatch] = {}
    for value in model.graph.output:
        if value.name not in outputs or not value.type.tensor_type.HasField("shape"):
            continue
        declared = [dim.dim_value if dim.HasField("dim_value") else (dim.dim_param or None)
                    for dim in value.type.tensor_type.shape.dim]
        actual = list(np.shape(outputs[value.name]))
        wrong_rank = len(declared) != len(actual)
        if wrong_rank or any(isinstance(d, int) and d > 0 and d != a for d, a in zip(declared, actual, strict=True)):
            mismatches[value.name] = {"declared": ["?" if d is None else d for d in declared], "actual": actual}
    notes = [f"output '{name}' is declared {shapes['declared']} but the model produces {shapes['actual']}"
             f"{' (another rank)' if len(shapes['declared']) != len(shapes['actual']) else ''}: the declaration is "
             "wrong; benchmarks and validation use the real shape, tools that trust the declaration may fail"
             for name, shapes in mismatches.items()]
    return mismatches, notes


def explain_failure(exc: BaseException, batch: int, data: BenchData | None) -> str:
    """Why a row could not be measured, in words a user can act on."""
    if isinstance(exc, BatchError):
        return str(exc)
    known = explain_batch_failure(exc, batch)
    if known:
        return known
    reason = f"{type(exc).__name__}: {short_message(exc)}"
    if data is not None and data.random and data.notes:
        reason += f" (fed seeded random inputs: {'; '.join(data.notes)})"
    return reason
