"""Reading a user's ONNX file, and the checks of its interface that every later stage relies on.

The file is opened through ``qdeploy.core.userfiles`` (regular files only), its
external data must stay in the model's folder with sane offsets and lengths,
the graph must declare outputs, and its inputs must be tensors qdeploy can feed
(numbers or booleans) of positive or symbolic dimensions (-1 counts as
symbolic) whose one sample fits in memory.  Each refusal is a ``ModelError`` (exit 2) naming the file, tensor or
input and what to do.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from qdeploy.calibration.readers import FEEDABLE_TYPES, check_sample_fits, inputs_of
from qdeploy.core.errors import DataError, ModelError, UserFileError
from qdeploy.core.userfiles import check_regular_file, open_regular_file

if TYPE_CHECKING:
    import onnx


@dataclass(frozen=True)
class ExternalSlice:
    """Where one tensor's external data lies: a file in the model's folder, an offset and a length."""

    tensor: str
    file: Path
    offset: int
    length: int


def load_onnx(path: Path, *, max_bytes: int | None = None, external_data: bool = True) -> onnx.ModelProto:
    """Load an ONNX file with its external data; clear ModelErrors for every way it can be wrong.

    ``external_data=False`` reads and checks the file and the external data's places without loading them.
    """
    import onnx
    from google.protobuf.message import DecodeError

    try:
        stream = open_regular_file(path, "model file")
    except UserFileError as exc:
        raise ModelError(str(exc)) from None
    with stream:
        size = os.fstat(stream.fileno()).st_size
        _check_size(path, size, max_bytes, "the file")
        try:  # from bytes: onnx.load would look for a file name on the stream
            model = onnx.load_model_from_string(stream.read())
        except (DecodeError, ValueError, RuntimeError) as exc:
            raise ModelError(f"{path}: not a readable ONNX model ({type(exc).__name__}: {exc}); "
                             "check that the file is complete and really ONNX") from None
    if not model.graph.node and not model.graph.output:
        raise ModelError(f"{path}: not an ONNX model (no graph found); check that the file is complete and really ONNX")
    try:
        slices = external_slices(model, path.parent)
    except ModelError as exc:
        raise ModelError(f"{path}: {exc}") from None
    _check_size(path, size + sum(piece.length for piece in slices), max_bytes, "the model with its external data")
    if external_data and slices:
        try:
            onnx.load_external_data_for_model(model, str(path.parent))
        except (OSError, ValueError) as exc:
            raise ModelError(f"{path}: cannot load external data: {exc}; keep the data files beside the "
                             "model") from None
    return model


def _check_size(path: Path, size: int, max_bytes: int | None, what: str) -> None:
    if max_bytes is not None and size > max_bytes:
        raise ModelError(f"{path}: {what} is {size / 1e6:.0f} MB, above the cap of {max_bytes / 1e6:.0f} MB; "
                         "raise model.max_size_mb if this machine can hold it")


def check_external_locations(model: onnx.ModelProto, base: Path) -> None:
    """Refuse external data that points outside the model's folder, at no regular file, or past its file's end."""
    external_slices(model, base)


def external_slices(model: onnx.ModelProto, base: Path) -> list[ExternalSlice]:
    """Each external tensor's file, offset and length, checked; ModelError naming the tensor otherwise."""
    from onnx.external_data_helper import _get_all_tensors

    root = base.resolve()
    slices = []
    for tensor in _get_all_tensors(model):
        entries = {entry.key: entry.value for entry in tensor.external_data}
        if "location" not in entries:
            continue
        file = _external_file(tensor.name, entries["location"], base, root)
        offset = _whole_number(tensor.name, entries, "offset") or 0
        file_size = file.stat().st_size
        length = _whole_number(tensor.name, entries, "length")
        length = max(file_size - offset, 0) if length is None else length
        if offset + length > file_size:
            raise ModelError(f"tensor '{tensor.name}': external data asks bytes {offset}..{offset + length} of "
                             f"'{entries['location']}', which holds {file_size}; the data file is truncated or "
                             "belongs to another model")
        slices.append(ExternalSlice(tensor.name, file, offset, length))
    return slices


def _external_file(tensor: str, location: str, base: Path, root: Path) -> Path:
    if "\0" in location:
        raise ModelError(f"tensor '{tensor}': external data location {location!r} is not a valid file name; the "
                         "model file is damaged")
    target = Path(os.path.realpath(base / location))  # realpath, unlike resolve, does not raise on a link loop
    if Path(location).is_absolute() or not target.is_relative_to(root):
        raise ModelError(f"tensor '{tensor}': external data location '{location}' points outside "
                         f"the model's folder {root}; refused for safety")
    if not os.path.lexists(base / location):
        raise ModelError(f"tensor '{tensor}': external data file '{location}' is missing "
                         f"in {root}; keep the data files beside the model")
    try:
        return check_regular_file(base / location, f"external data file of tensor '{tensor}'")
    except UserFileError as exc:
        raise ModelError(str(exc)) from None


def _whole_number(tensor: str, entries: dict[str, str], key: str) -> int | None:
    raw = entries.get(key)
    if raw is None or raw == "":
        return None
    try:
        value = int(raw)
    except ValueError:
        raise ModelError(f"tensor '{tensor}': external data {key} '{raw}' is not a whole number; the model file "
                         "is damaged or its exporter is broken: re-export it") from None
    if value < 0:
        raise ModelError(f"tensor '{tensor}': external data {key} {value} is negative; the model file is damaged "
                         "or its exporter is broken: re-export it")
    return value


def check_has_outputs(model: onnx.ModelProto) -> None:
    """A graph without outputs computes nothing a stage could check, validate or time."""
    if not model.graph.output:
        raise ModelError(f"the graph has {len(model.graph.node)} nodes but declares no outputs, so nothing it "
                         "computes can be validated or timed; re-export it with its outputs")


def check_feedable_inputs(model: onnx.ModelProto) -> None:
    """Every real input is a tensor of a type qdeploy can build data for (numbers or booleans)."""
    import onnx

    initializers = {init.name for init in model.graph.initializer}
    for value in model.graph.input:
        if value.name in initializers:
            continue
        kind = value.type.WhichOneof("value")
        if kind != "tensor_type":
            raise ModelError(f"input '{value.name}' is a {kind or 'value of no type'}; qdeploy feeds tensors "
                             "only: make the model take tensors")
        elem = value.type.tensor_type.elem_type
        if elem not in FEEDABLE_TYPES:
            name = onnx.TensorProto.DataType.Name(elem) if elem in onnx.TensorProto.DataType.values() else elem
            raise ModelError(f"input '{value.name}' is a tensor of {name}; qdeploy feeds numeric and bool "
                             f"tensors only (its calibration, validation and benchmarks build such data): "
                             f"{_unfeedable_hint(elem)}")


def _unfeedable_hint(elem_type: int) -> str:
    from onnx import TensorProto

    if elem_type == TensorProto.STRING:
        return "move string processing such as tokenization out of the model"
    # bfloat16, float8, 4-bit: numpy has no such type, and ONNX Runtime's CPU provider few kernels for them
    return ("export the float32 model instead (torch: model.float() before exporting); qdeploy's fp16 step and "
            "int8 quantization make the reduced-precision artifacts from it")


def check_declared_shapes(model: onnx.ModelProto) -> list[str]:
    """Dimensions of -1 (how some exporters, Paddle's among them, say 'dynamic') become named symbolic ones;
    any other negative dimension is refused; one sample of all inputs (symbolic dimensions as 1) must fit in
    memory.  Returns the inputs whose -1 dimensions were named."""
    initializers = {init.name for init in model.graph.initializer}
    named = []
    for value in model.graph.input:
        if value.name in initializers or not value.type.tensor_type.HasField("shape"):
            continue
        dims = value.type.tensor_type.shape.dim
        shown = [dim.dim_value if dim.HasField("dim_value") else dim.dim_param or "?" for dim in dims]
        if any(dim.HasField("dim_value") and dim.dim_value < -1 for dim in dims):
            raise ModelError(f"input '{value.name}' declares shape {shown} with a negative dimension; give its shape "
                             f"in the recipe's model.inputs, a name for each dynamic dimension "
                             f"(e.g. - {{name: {value.name}, shape: [batch, ...]}})")
        for axis, dim in enumerate(dims):
            if dim.HasField("dim_value") and dim.dim_value == -1:
                dim.dim_param = f"{value.name}_dim{axis}"  # replaces the -1 (one of value/param)
                named.append(value.name)
    try:
        check_sample_fits(inputs_of(model), "model inputs")
    except DataError as exc:
        raise ModelError(str(exc)) from None
    return sorted(set(named))


def model_size_on_disk(path: Path) -> int | None:
    """Bytes of an ONNX file plus the external data it refers to, without loading the weights; None when the file
    cannot be read (the export stage then says why)."""
    try:
        size = path.stat().st_size
        if size > PARSE_FOR_SIZE_BELOW:  # its weights are in the file itself: reading it would cost their memory
            return size
        model = load_onnx(path, external_data=False)
        return size + sum(piece.length for piece in external_slices(model, path.parent))
    except (ModelError, OSError):
        return None


PARSE_FOR_SIZE_BELOW = 64_000_000
"""A model file above this holds its weights itself; below, it is parsed to add its external data files."""


def external_data_sources(model_file: Path) -> list[Path]:
    """The external data files an ONNX model reads (new weights in the same graph file make a new export); none
    when the model cannot be read: the export stage then says why."""
    try:
        model = load_onnx(model_file, external_data=False)
        files = sorted({piece.file for piece in external_slices(model, model_file.parent)})
    except ModelError:
        return []
    return [check_regular_file(path, "external data file") for path in files]
