"""The value a recipe freezes an input to (``model.inputs[].value``): read, checked, cast to the input's type.

What can be checked from the recipe alone is checked when it loads (``check_frozen_spec``: finite numbers, a
rectangular list, a ``.npy`` name, no ``low``/``high`` or contradicting ``shape`` beside a value); what needs the
model (the input exists, its element type and shape take the value without loss) when the export stage or
``qdeploy check`` reads the model (``frozen_arrays``).  Each refusal names the input and what to do.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, Union

import numpy as np

from qdeploy.core.arrayfiles import load_npy
from qdeploy.core.errors import DataError, ModelError, UserFileError

if TYPE_CHECKING:
    import onnx

FrozenValue = Union[bool, int, float, str, list[Any]]  # noqa: UP007  (pydantic reads it at run time on 3.10)
"""A number, a nested list of numbers, or a .npy file relative to the recipe."""


class ShapedInput(Protocol):
    """What this module reads of ``qdeploy.stages.export.config.InputSpec`` (which imports this module)."""

    name: str
    shape: list[int | str] | None
    dtype: str
    low: float | None
    high: float | None
    value: FrozenValue | None
    model_fields_set: set[str]


MAX_VALUE_BYTES = 64_000_000
"""Largest frozen value read from a .npy file: a constant of the model, not a dataset."""


def check_frozen_spec(spec: ShapedInput) -> None:
    """Recipe-level checks of a frozen input (ValueError naming the field, as pydantic reports it)."""
    if spec.low is not None or spec.high is not None:
        raise ValueError(f"input '{spec.name}': 'value' freezes it, so 'low'/'high' (ranges of random data for it) "
                         "contradict it; remove them")
    if isinstance(spec.value, str):
        if not spec.value.endswith(".npy"):
            raise ValueError(f"input '{spec.name}': value '{spec.value}' is text; give a number, a list of numbers "
                             "or a .npy file (relative to the recipe)")
        return
    array = literal_array(spec)
    if spec.shape is not None and list(spec.shape) != list(array.shape):
        raise ValueError(f"input '{spec.name}': shape {spec.shape} contradicts its value of shape {list(array.shape)}; "
                         "remove 'shape' (a frozen input takes the value's shape)")
    if "dtype" in spec.model_fields_set:
        cast_value(array, np.dtype(spec.dtype), spec.name)


def literal_array(spec: ShapedInput) -> np.ndarray:
    """The recipe's number or nested list as an array; ValueError when it is not rectangular, finite numbers."""
    value = spec.value
    try:
        array = np.array(value)
    except ValueError:
        array = np.array([], dtype=object)
    if array.dtype == object or array.dtype.kind not in "biuf" or (isinstance(value, list) and array.size == 0):
        raise ValueError(f"input '{spec.name}': value must be a number or a non-empty, rectangular list of numbers "
                         f"(got {_short(value)})")
    if array.dtype.kind == "f" and not np.all(np.isfinite(array)):
        raise ValueError(f"input '{spec.name}': value holds NaN or Inf")
    return array


def cast_value(array: np.ndarray, dtype: np.dtype, name: str) -> np.ndarray:
    """``array`` in ``dtype`` when nothing is lost (integers stay whole and in range, floats stay finite);
    ValueError naming the input otherwise."""
    kind = dtype.kind
    if kind == "b":
        if array.dtype.kind != "b" and not np.all(np.isin(array, (0, 1))):
            raise ValueError(f"input '{name}' is bool; its value {_short(array.tolist())} is not 0/1 or true/false")
        return array.astype(bool)
    if kind in "iu":
        if array.dtype.kind == "f" and not np.all(array == np.round(array)):
            raise ValueError(f"input '{name}' is {dtype}; its value {_short(array.tolist())} is not whole: freezing "
                             "it would round it")
        info = np.iinfo(dtype)
        if array.size and (array.min() < info.min or array.max() > info.max):
            raise ValueError(f"input '{name}' is {dtype}; its value {_short(array.tolist())} is outside "
                             f"{info.min}..{info.max}")
        return array.astype(dtype)
    with np.errstate(over="ignore"):
        cast = array.astype(dtype)
    if not np.all(np.isfinite(cast)):
        raise ValueError(f"input '{name}' is {dtype}; its value {_short(array.tolist())} overflows it")
    return cast


def frozen_arrays(inputs: list[ShapedInput], model: onnx.ModelProto,
                  resolve: Callable[[str], Path]) -> dict[str, np.ndarray]:
    """Input name -> its frozen value, cast to the model's declared element type and checked against its shape."""
    from onnx import helper


    declared = {value.name: value for value in model.graph.input}
    initializers = {init.name for init in model.graph.initializer}
    frozen = {}
    for spec in inputs:
        if spec.value is None:
            continue
        if spec.name not in declared or spec.name in initializers:
            real = sorted(name for name in declared if name not in initializers)
            raise ModelError(f"model.inputs '{spec.name}' has a value to freeze, but the model has no such input; "
                             f"its inputs are {real}")
        tensor_type = declared[spec.name].type.tensor_type
        dtype = np.dtype(helper.tensor_dtype_to_np_dtype(tensor_type.elem_type))
        array = read_value(spec, resolve)
        try:
            array = cast_value(array, dtype, spec.name)
        except ValueError as exc:
            raise ModelError(f"model.inputs '{spec.name}': {exc}") from None
        if tensor_type.HasField("shape"):
            _check_shape(spec.name, array, tensor_type.shape)
        frozen[spec.name] = array
    return frozen


def read_value(spec: ShapedInput, resolve: Callable[[str], Path]) -> np.ndarray:
    """The spec's value as an array: the literal, or the .npy file (regular, small, not pickled, numbers)."""
    if not isinstance(spec.value, str):
        return literal_array(spec)
    limit = (MAX_VALUE_BYTES, f"a frozen value may take ({MAX_VALUE_BYTES // 1_000_000} MB: it is a small constant)")
    try:  # the one checked loader (qdeploy.core.arrayfiles): the header is checked before numpy allocates
        array = load_npy(resolve(spec.value), f"value file of input '{spec.name}'", limit)
    except (UserFileError, DataError) as exc:
        raise ModelError(f"model.inputs '{spec.name}': {exc}") from None
    if array.dtype.kind not in "biuf" or (array.dtype.kind == "f" and not np.all(np.isfinite(array))):
        raise ModelError(f"model.inputs '{spec.name}': '{spec.value}' holds {array.dtype} values"
                         f"{' with NaN or Inf' if array.dtype.kind == 'f' else ''}; a frozen value is finite numbers")
    if spec.shape is not None and list(spec.shape) != list(array.shape):
        raise ModelError(f"model.inputs '{spec.name}': shape {spec.shape} contradicts '{spec.value}' of shape "
                         f"{list(array.shape)}; remove 'shape'")
    return array


def _check_shape(name: str, array: np.ndarray, shape: onnx.TensorShapeProto) -> None:
    dims = [dim.dim_value if dim.HasField("dim_value") and dim.dim_value > 0 else None for dim in shape.dim]
    fits = len(dims) == array.ndim and all(want is None or want == got for want, got in zip(dims, array.shape,
                                                                                             strict=True))
    if not fits:
        shown = [dim if dim is not None else "?" for dim in dims]
        raise ModelError(f"model.inputs '{name}': its value has shape {list(array.shape)}; the model's input has "
                         f"shape {shown} (rank {len(dims)}): give a value of that shape")


def describe(array: np.ndarray) -> Any:
    """What the sidecar says a frozen value is: the value itself when small, else its shape and a digest."""
    import hashlib

    if array.size <= 16:
        return array.tolist()
    return {"shape": list(array.shape), "sha256": hashlib.sha256(np.ascontiguousarray(array).tobytes()).hexdigest()}


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
