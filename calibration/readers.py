"""Dataset readers: stream feeds (input name -> array) for calibration and validation.

Readers yield one sample at a time so memory stays bounded however many
samples a folder holds.  Every sample is checked against the model's inputs;
a mismatch is a ``DataError`` that names the file and the input.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from qdeploy.core.arrayfiles import ArrayLimit, fmt_bytes, load_npy, load_npz
from qdeploy.core.errors import DataError
from qdeploy.core.memory import available_memory
from qdeploy.core.onnx_wire import load_model
from qdeploy.core.userfiles import files_in_folder
from qdeploy.graph.integer_inputs import Ranges

if TYPE_CHECKING:
    import onnx

__all__ = ["DEFAULT_RANDOM_SAMPLES", "FEEDABLE_TYPES", "SAMPLE_MEMORY_SHARE", "InputInfo", "Ranges",
           "check_sample_fits", "fit_to_input", "inputs_of", "is_npy_sample", "model_inputs",
           "npy_samples", "random_samples", "sample_limit", "sample_memory_cap", "sample_mismatch"]


log = logging.getLogger(__name__)

DEFAULT_RANDOM_SAMPLES = 8
SAMPLE_MEMORY_SHARE = 0.25
"""Largest share of the available memory one sample may take: calibration and validation hold several at once."""
_ONNX_TO_NUMPY = {
    1: np.float32, 2: np.uint8, 3: np.int8, 4: np.uint16, 5: np.int16, 6: np.int32, 7: np.int64,
    9: np.bool_, 10: np.float16, 11: np.float64, 12: np.uint32, 13: np.uint64,
}
FEEDABLE_TYPES = frozenset(_ONNX_TO_NUMPY)
"""ONNX element types the readers and random data can feed (no strings, bfloat16, float8 or complex)."""


@dataclass(frozen=True)
class InputInfo:
    """A model input as the graph declares it; symbolic dimensions are None."""

    name: str
    shape: tuple[int | None, ...]
    dtype: np.dtype

    def concrete_shape(self, batch: int = 1) -> tuple[int, ...]:
        """Shape with symbolic dimensions set: the first to the batch size, others to 1."""
        return tuple((batch if index == 0 else 1) if dim is None else dim for index, dim in enumerate(self.shape))


def model_inputs(model_path: Path) -> list[InputInfo]:
    """The real inputs of an ONNX model (initializers listed as inputs excluded)."""

    return inputs_of(load_model(model_path, load_external_data=False))


def inputs_of(model: onnx.ModelProto) -> list[InputInfo]:
    """The real inputs of a loaded model; negative or zero dimensions count as symbolic."""
    initializers = {init.name for init in model.graph.initializer}
    infos = []
    for value in model.graph.input:
        if value.name in initializers:
            continue
        tensor_type = value.type.tensor_type
        dims = tuple(dim.dim_value if dim.HasField("dim_value") and dim.dim_value > 0 else None
                     for dim in tensor_type.shape.dim)
        dtype = np.dtype(_ONNX_TO_NUMPY.get(tensor_type.elem_type, np.float32))
        infos.append(InputInfo(value.name, dims, dtype))
    return infos


def sample_memory_cap() -> int:
    """Bytes one sample (all inputs of one feed) may take."""
    return int(SAMPLE_MEMORY_SHARE * available_memory())


def check_sample_fits(inputs: list[InputInfo], label: str) -> None:
    """Refuse, before anything is allocated, inputs whose one sample would not fit in memory (estimate named)."""
    sizes = {info.name: math.prod(info.concrete_shape()) * info.dtype.itemsize for info in inputs}
    cap = sample_memory_cap()
    if sum(sizes.values()) <= cap:
        return
    name = max(sizes, key=sizes.__getitem__)
    info = next(info for info in inputs if info.name == name)
    shape = [d if d is not None else 1 for d in info.shape]
    raise DataError(f"{label}: one sample takes {fmt_bytes(sum(sizes.values()))} (input "
                    f"'{name}' {shape} {info.dtype} alone {fmt_bytes(sizes[name])}); qdeploy holds several "
                    f"samples at once and allows one {fmt_bytes(cap)}, a quarter of the memory available now: "
                    "declare smaller shapes in model.inputs")


def random_samples(inputs: list[InputInfo], count: int, *, seed: int = 0,
                   ranges: Ranges | None = None) -> Iterator[dict[str, np.ndarray]]:
    """Seeded random feeds; integer inputs get integers in [low, high), floats a standard normal or [low, high)."""
    check_sample_fits(inputs, "random data")
    _warn_of_unit_dimensions(inputs)
    rng = np.random.default_rng(seed)
    ranges = ranges or {}
    for _ in range(count):
        yield {info.name: _random_array(info, rng, *ranges.get(info.name, (None, None))) for info in inputs}


_WARNED: set[tuple[str, tuple[int | None, ...]]] = set()


def _warn_of_unit_dimensions(inputs: list[InputInfo]) -> None:
    """Once per input: random data sets a symbolic dimension past the first to 1, which nothing may want (an
    image of 1x1 pixels fails a 7x7 convolution, and a latency measured on it says nothing)."""
    for info in inputs:
        axes = [axis for axis, dim in enumerate(info.shape) if dim is None and axis > 0]
        if axes and (info.name, info.shape) not in _WARNED:
            _WARNED.add((info.name, info.shape))
            shape = ["N" if axis == 0 else (1 if dim is None else dim) for axis, dim in enumerate(info.shape)]
            log.warning("random data for input '%s': its symbolic axes %s are 1 (shape %s); give them a size in "
                        "model.inputs (shape: [...]) or feed a dataset", info.name, axes, shape)


def _random_array(info: InputInfo, rng: np.random.Generator, low: float | None, high: float | None) -> np.ndarray:
    shape = info.concrete_shape()
    if info.dtype == np.bool_:  # the integers 0 and 1 in [low, high): low 1 gives a mask that hides nothing
        lo = min(max(int(low), 0), 1) if low is not None else 0
        hi = min(max(int(high), lo + 1), 2) if high is not None else 2
        return rng.integers(lo, hi, size=shape).astype(np.bool_)
    if np.issubdtype(info.dtype, np.integer):
        limits = np.iinfo(info.dtype)
        lo = int(low) if low is not None else 0
        hi = int(high) if high is not None else min(int(limits.max), 100)
        return rng.integers(lo, max(hi, lo + 1), size=shape).astype(info.dtype)
    if low is not None or high is not None:
        lo = 0.0 if low is None else low
        hi = lo + 1.0 if high is None else high
        return rng.uniform(lo, hi, size=shape).astype(info.dtype)
    return rng.standard_normal(size=shape).astype(info.dtype)


def npy_samples(folder: Path, inputs: list[InputInfo], *, limit: int | None = None, dataset_name: str = "",
                frozen: Mapping[str, np.ndarray] | None = None) -> Iterator[dict[str, np.ndarray]]:
    """Feeds from a folder of .npz (keyed by input name) or .npy (one-input models) files, in name order."""
    label = f"dataset '{dataset_name}' ({folder})" if dataset_name else str(folder)
    if not folder.is_dir():
        raise DataError(f"{label}: folder does not exist; create it or fix 'path' in the recipe")
    files = files_in_folder(folder, is_npy_sample, f"dataset '{dataset_name or folder}'")
    if not files:
        raise DataError(f"{label}: no .npy or .npz samples in the folder")
    if any(p.suffix == ".npy" for p in files) and len(inputs) != 1:
        raise DataError(f"{label}: .npy samples serve one-input models only; this model has inputs "
                        f"{[i.name for i in inputs]}: use .npz files keyed by input name")
    for path in files[:limit] if limit else files:
        yield _load_sample(path, inputs, frozen or {})


def is_npy_sample(path: Path) -> bool:
    return path.suffix in (".npy", ".npz")


def sample_limit() -> ArrayLimit:
    """What one array of a sample may take: a quarter of the memory available now (``SAMPLE_MEMORY_SHARE``)."""
    cap = sample_memory_cap()
    return cap, f"one sample may take ({fmt_bytes(cap)}, a quarter of the memory available now)"


def _load_sample(path: Path, inputs: list[InputInfo],
                 frozen: Mapping[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
    # the one checked loader (qdeploy.core.arrayfiles): headers refused before numpy allocates anything
    if path.suffix == ".npy":
        raw = {inputs[0].name: load_npy(path, "sample", sample_limit())}
    else:
        raw = load_npz(path, "sample", sample_limit())
    check_frozen_keys(raw, frozen or {}, path)
    feeds = {}
    for info in inputs:
        if info.name not in raw:
            raise DataError(f"{path}: no array for model input '{info.name}'; the file holds {sorted(raw)}")
        feeds[info.name] = fit_to_input(raw[info.name], info, path)
    return feeds


def check_frozen_keys(raw: Mapping[str, np.ndarray], frozen: Mapping[str, np.ndarray], path: Path) -> None:
    """A sample may hold an input the recipe froze only at the frozen value (then it is ignored): at another value
    it was recorded for a model the exported one no longer is."""
    for name, want in frozen.items():
        if name not in raw:
            continue
        got = np.asarray(raw[name])
        same = got.size == want.size and got.dtype.kind in "biuf" and np.array_equal(got.reshape(want.shape), want)
        if not same:
            shown = got.tolist() if got.size <= 8 else f"an array of shape {list(got.shape)}"
            raise DataError(f"{path}: '{name}' holds {shown}, but the recipe freezes input '{name}' to "
                            f"{want.tolist() if want.size <= 8 else 'another value'} (model.inputs): this sample was "
                            f"recorded for another value; remove '{name}' from it or freeze the value it holds")


def fit_to_input(array: np.ndarray, info: InputInfo, path: Path) -> np.ndarray:
    """The array checked against the model input (shape, kind of dtype, finite) and cast to its dtype."""
    problem = sample_mismatch(array.shape, array.dtype, info)
    if problem is not None:
        raise DataError(f"{path}: {problem}")
    if len(array.shape) == len(info.shape) - 1:
        array = array[np.newaxis]  # a sample without its batch dimension
    if array.dtype != info.dtype:
        array = array.astype(info.dtype)
    if np.issubdtype(array.dtype, np.floating) and not np.all(np.isfinite(array)):
        raise DataError(f"{path}: input '{info.name}' holds NaN or Inf values")
    return np.ascontiguousarray(array).reshape(array.shape)  # ascontiguousarray alone makes a 0-d input (1,)


def sample_mismatch(shape: tuple[int, ...], dtype: np.dtype, info: InputInfo) -> str | None:
    """Why an array of this shape and dtype cannot feed the input, None when it can: a sample may lack the batch
    dimension, and a float array feeds any float input (an integer one any integer or bool input)."""
    if len(shape) == len(info.shape) - 1:
        shape = (1, *shape)  # a sample without its batch dimension
    if len(shape) != len(info.shape) or any(
        want is not None and got != want for got, want in zip(shape, info.shape, strict=True)
    ):
        return (f"input '{info.name}' has shape {list(shape)}; "
                f"the model expects {[d if d is not None else '?' for d in info.shape]}")
    if np.issubdtype(dtype, np.floating) != np.issubdtype(info.dtype, np.floating):
        return f"input '{info.name}' is {dtype}; the model expects {info.dtype}"
    return None
