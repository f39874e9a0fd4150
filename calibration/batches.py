"""Samples assembled into batches, for benchmarks and for validation at each batch size.

A dataset's samples usually hold one row each (``[1, 3, 224, 224]``).  A batch of B is built by stacking
the rows of the samples along each input's batch axis, in order, cycling through them when the dataset has
fewer than B rows; every value fed is a value the dataset holds.  Only samples whose other dimensions
match the first sample's are stacked (a dynamic-width model's samples of another width cannot share a
batch).

The batch axis of an input is where the model's batch symbol sits: the symbol at axis 0 of the inputs
(``batch``, ``N``, ...), wherever else it appears (a recurrent state ``[2, batch, 128]`` is batched on
axis 1); an unnamed dynamic axis 0 counts too.  Inputs without it (a scalar sample rate, a fixed-size
state) are fed as the first sample has them.  Inputs that lead with different symbols have no batch axis: a
graph network's ``[num_atoms, ...]``, ``[num_edges, ...]`` and ``[num_residues, ...]`` inputs are one molecule,
and cutting one of them to a row timed another workload than validation ran (caustic-nmr: one residue of four).
A model none of whose inputs has a dynamic batch axis takes batch 1, or its own fixed batch (inputs declared
[4, ...] at batch size 4), only, and says so otherwise.
"""

from __future__ import annotations

import itertools
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypedDict

import numpy as np

from qdeploy.core.memory import memory_override
from qdeploy.core.onnx_wire import load_model

__all__ = ["Batch", "BatchAxes", "BatchError", "BatchInfo", "Feed", "available_memory_bytes", "batch_axes",
           "explain_batch_failure", "make_batch"]

Feed = dict[str, np.ndarray]


class BatchError(ValueError):
    """A batch that cannot be built (a static batch dimension, no samples, too large for memory)."""


@dataclass(frozen=True)
class BatchAxes:
    """Per real input of a model, its batch axis (None: fed as the sample has it), and its declared dims."""

    axes: dict[str, int | None]
    dims: dict[str, list[int | str | None]] = field(default_factory=dict)
    leading: tuple[str, ...] = ()
    """The different symbols the inputs lead with, where there are several (then no input has a batch axis)."""

    @property
    def batchable(self) -> bool:
        return any(axis is not None for axis in self.axes.values())

    def fixed_batch(self) -> int | None:
        """The static leading dimension every shaped input shares (a model exported at batch 4 takes 4)."""
        firsts = {dims[0] for dims in self.dims.values() if dims}
        only = firsts.pop() if len(firsts) == 1 else None
        return only if isinstance(only, int) else None

    def static_reason(self) -> str:
        """Why a batch above 1 cannot be fed: the declared shapes."""
        shown = ", ".join(f"'{name}' {_show(dims)}" for name, dims in self.dims.items())
        if self.leading:
            return (f"the inputs lead with different dimensions ({', '.join(self.leading)}): none of them is a "
                    f"batch of independent samples (inputs: {shown}); each sample is fed whole at batch 1")
        return (f"no input has a dynamic batch dimension (inputs: {shown}); give the first dimension a name in "
                "model.inputs (e.g. shape ['batch', ...]) or export the model with a dynamic batch axis")


def _show(dims: list[int | str | None]) -> str:
    return "[" + ", ".join("?" if dim is None else str(dim) for dim in dims) + "]"


def batch_axes(model_path: Path) -> BatchAxes:
    """The batch axis of each real input of an ONNX model, from its declared dimensions."""

    model = load_model(model_path, load_external_data=False)
    initializers = {init.name for init in model.graph.initializer}
    dims: dict[str, list[int | str | None]] = {}
    for value in model.graph.input:
        if value.name in initializers:
            continue
        shape = value.type.tensor_type.shape
        dims[value.name] = [dim.dim_value if dim.HasField("dim_value") and dim.dim_value > 0
                            else (dim.dim_param if dim.dim_param and dim.dim_param != "?" else None)
                            for dim in shape.dim]
    leading = tuple(dict.fromkeys(shape[0] for shape in dims.values() if shape and isinstance(shape[0], str)))
    if len(leading) > 1:
        return BatchAxes(dict.fromkeys(dims), dims, leading)
    return BatchAxes(_axes_of(dims), dims)


def _axes_of(dims: dict[str, list[int | str | None]]) -> dict[str, int | None]:
    firsts = Counter(shape[0] for shape in dims.values() if shape and isinstance(shape[0], str))
    symbol = firsts.most_common(1)[0][0] if firsts else None
    axes: dict[str, int | None] = {}
    for name, shape in dims.items():
        if symbol is not None and symbol in shape:
            axes[name] = shape.index(symbol)
        elif shape and shape[0] is None:
            axes[name] = 0
        else:
            axes[name] = None
    return axes


class BatchInfo(TypedDict, total=False):
    """How a batch was assembled (a benchmark row's ``data``); ``make_batch`` writes every key but
    ``samples_skipped`` (only when samples of other shapes were left out), the benchmark stage adds ``source`` and
    ``notes``."""

    source: str
    rows: int
    distinct_rows: int
    samples_used: int
    repeated: bool
    shapes: dict[str, list[int]]
    samples_skipped: str
    notes: list[str]


@dataclass
class Batch:
    """A feed of one batch size, and how it was assembled."""

    feed: Feed
    info: BatchInfo


def make_batch(samples: list[Feed], axes: BatchAxes, batch: int, *, max_bytes: int | None = None) -> Batch:
    """A feed of `batch` rows stacked from the samples; BatchError when the model or the memory cannot take it."""
    if not samples:
        raise BatchError("no samples to build a batch from")
    if batch > 1 and not axes.batchable and batch != axes.fixed_batch():
        raise BatchError(f"batch {batch} cannot be fed: {axes.static_reason()}")
    first = samples[0]
    group = [sample for sample in samples if _same_other_dims(sample, first, axes)]
    rows = [(sample, row) for sample in group for row in range(_rows(sample, axes))]
    if not rows:
        raise BatchError("the samples hold no rows along the batch axis")
    if max_bytes is not None:
        needed = _bytes_per_row(first, axes) * batch + _unbatched_bytes(first, axes)
        if needed > max_bytes:
            raise BatchError(f"batch {batch} needs {_size(needed)} for its inputs alone; {_size(max_bytes)} of this "
                             "machine's available memory may go to them: choose a smaller batch size")
    chosen = list(itertools.islice(itertools.cycle(rows), batch))
    feed = {}
    for name, value in first.items():
        axis = axes.axes.get(name)
        if axis is None or value.ndim <= axis:
            feed[name] = value
            continue
        feed[name] = np.ascontiguousarray(np.concatenate(
            [np.take(sample[name], [row], axis=axis) for sample, row in chosen], axis=axis))
    distinct = len(rows)
    info: BatchInfo = {"rows": batch, "distinct_rows": min(distinct, batch),
                       "samples_used": len({id(s) for s, _ in chosen}), "repeated": batch > distinct,
                       "shapes": {name: list(value.shape) for name, value in feed.items()}}
    if len(group) < len(samples):
        info["samples_skipped"] = f"{len(samples) - len(group)} samples of other shapes than the first"
    return Batch(feed, info)


def _size(count: int) -> str:
    return f"{count / 2**30:.2f} GiB" if count >= 2**30 else f"{count / 2**20:.1f} MiB"


def _rows(sample: Feed, axes: BatchAxes) -> int:
    counts = [sample[name].shape[axis] for name, axis in axes.axes.items()
              if axis is not None and name in sample and sample[name].ndim > axis]
    return min(counts) if counts else 1


def _same_other_dims(sample: Feed, first: Feed, axes: BatchAxes) -> bool:
    for name, value in first.items():
        other = sample.get(name)
        if other is None or other.ndim != value.ndim or other.dtype != value.dtype:
            return False
        axis = axes.axes.get(name)
        if any(a != b for index, (a, b) in enumerate(zip(other.shape, value.shape, strict=True)) if index != axis):
            return False
    return True


def _bytes_per_row(sample: Feed, axes: BatchAxes) -> int:
    total = 0
    for name, value in sample.items():
        axis = axes.axes.get(name)
        if axis is not None and value.ndim > axis and value.shape[axis]:
            total += value.nbytes // value.shape[axis]
    return total


def _unbatched_bytes(sample: Feed, axes: BatchAxes) -> int:
    return sum(value.nbytes for name, value in sample.items() if axes.axes.get(name) is None)


def available_memory_bytes() -> int | None:
    """Memory the kernel says is available now (MemAvailable, or QDEPLOY_AVAILABLE_MEMORY); None where unknown."""
    if (override := memory_override()) is not None:
        return override
    try:
        with open("/proc/meminfo", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


_OUT_OF_MEMORY = re.compile(r"bad_alloc|failed to allocate|out of memory|cannot allocate|std::length_error", re.I)
_BAD_DIMS = re.compile(r"Got invalid dimensions for (input|output): (\S+).*?index: (\d+) Got: (\d+) Expected: (\d+)",
                       re.S)


def explain_batch_failure(exc: BaseException, batch: int) -> str | None:
    """Why a run at `batch` failed when the cause is the batch (memory, a static dimension); None otherwise."""
    text = " ".join(str(exc).split())
    if isinstance(exc, MemoryError) or _OUT_OF_MEMORY.search(text):
        return (f"batch {batch} does not fit in memory ({type(exc).__name__}: {text[:300]}); choose a smaller "
                "batch size or give the machine more memory")
    bad = _BAD_DIMS.search(text)
    if bad:
        kind, name, axis, got, expected = bad.groups()
        return (f"the model declares {kind} '{name}' with a static dimension {expected} at axis {axis}, but batch "
                f"{batch} gives {got}: the model was exported for a fixed size there; export it with a dynamic "
                "axis or name the dimension in model.inputs (qdeploy then re-infers the output shapes)")
    return None
