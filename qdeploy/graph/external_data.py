"""Models above protobuf's 2 GB limit: deciding when to write external data, without serialising the model.

``ModelProto.ByteSize()`` serialises the whole message (a copy of every weight) and raises ``EncodeError`` above
2 GiB, so no decision about a large model may call it.  ``needs_external_data`` sums the tensors from their
shapes (``graph_utils.model_bytes``) instead.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from qdeploy.core.errors import ModelError
from qdeploy.core.onnx_wire import encode_varint, load_model
from qdeploy.graph.light import light_copy, tag_of
from qdeploy.graph.utils import model_bytes, tensor_nbytes

if TYPE_CHECKING:
    import numpy as np
    import onnx

__all__ = ["PROTOBUF_SAFE_BYTES", "STREAM_ABOVE_BYTES", "append_external", "check_saved_model",
           "check_without_weights", "copy_exposing", "load_graph_only", "load_weights_from", "needs_external_data",
           "remove_saved", "save_exposing", "save_onnx", "save_with_data_file"]

PROTOBUF_SAFE_BYTES = 1_800_000_000
"""Above this a model is written as ``.onnx`` plus one data file (protobuf's hard limit is 2 GiB)."""


def needs_external_data(model: onnx.ModelProto, threshold: int | None = None) -> bool:
    """True when the model is too large to be one protobuf file (above ``threshold`` bytes when given)."""
    return model_bytes(model) > (PROTOBUF_SAFE_BYTES if threshold is None else threshold)


def save_onnx(model: onnx.ModelProto, path: Path, *, location: str | None = None, threshold: int | None = None) -> None:
    """Save a model; a large one with all its tensors in one data file beside it (``<name>.data`` by default).

    onnx moves the weights of a large model out of ``model`` into the file as it writes (the proto then refers to
    the file): one copy of the weights, never two.
    """
    import onnx

    path.parent.mkdir(parents=True, exist_ok=True)
    if needs_external_data(model, threshold):
        data_name = location or f"{path.name}.data"
        (path.parent / data_name).unlink(missing_ok=True)  # onnx appends to an existing data file
        onnx.save_model(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                        location=data_name, size_threshold=1024)
    elif model_bytes(model) > STREAM_ABOVE_BYTES:
        _save_streamed(model, path)
    else:
        onnx.save_model(model, str(path))


STREAM_ABOVE_BYTES = 64_000_000
"""One-file models above this are written tensor by tensor (``_save_streamed``)."""
_MODEL_GRAPH_TAG = b"\x3a"  # ModelProto.graph: field 7, length-delimited
_GRAPH_INITIALIZER_TAG = b"\x2a"  # GraphProto.initializer: field 5, length-delimited


def save_exposing(model: onnx.ModelProto, path: Path, outputs: list[onnx.ValueInfoProto], *,
                  external: bool = False, edit: Callable[[onnx.GraphProto], object] | None = None) -> None:
    """Write a probe of ``model``: its graph with ``outputs`` added to the graph outputs and no value_info, its
    weights streamed from ``model`` itself (neither copied nor serialised whole).  ``model`` is left as it is.

    ``external``: the weights go to one data file beside it (``<name>.data``), as a model above 2 GB needs.
    ``edit``: called on the probe's graph (its weights not yet in it) to add nodes, constants and outputs.
    """
    head = _without_initializers(model)
    del head.graph.value_info[:]  # a probe needs no shape hints; its outputs carry their types
    head.graph.output.extend(outputs)
    if edit is not None:
        edit(head.graph)
    if external:
        _write_external(head, model, path)
    else:
        _write_streamed(head, model, path)


EXTERNAL_MIN_BYTES = 1024
"""Tensors from this size go to the data file in ``_write_external`` (onnx's own default threshold)."""


def _write_external(head: onnx.ModelProto, model: onnx.ModelProto, path: Path) -> None:
    """``head`` with ``model``'s initializers, the large ones as references into ``<name>.data``, written one
    tensor at a time."""

    location = f"{path.name}.data"
    with (path.parent / location).open("wb") as data:
        for tensor in model.graph.initializer:
            if not tensor.HasField("raw_data") or tensor_nbytes(tensor) < EXTERNAL_MIN_BYTES:
                head.graph.initializer.append(tensor)
                continue
            raw = tensor.raw_data  # one tensor's bytes at a time
            _refer(_stand_in(head, tensor), location, data.tell(), len(raw))
            data.write(raw)
            del raw
    path.write_bytes(head.SerializeToString())


def save_with_data_file(model: onnx.ModelProto, path: Path) -> None:
    """Write ``model`` (value_info included) with its tensors from 1 KB in one data file ``<name>.data``, one
    tensor at a time; ``model`` is left as it is (onnx's own writer moves the weights out of the message)."""
    _write_external(_without_initializers(model), model, path)


def _save_streamed(model: onnx.ModelProto, path: Path) -> None:
    """Write a one-file model without serialising it whole (``SerializeToString`` makes a second copy of every
    weight): the model without its initializers, then each initializer as its own ``graph { initializer }``
    record.  Protobuf merges repeated records of a message field, so every reader parses the same model, with
    the initializers in their order."""
    _write_streamed(_without_initializers(model), model, path)


def _write_streamed(head: onnx.ModelProto, model: onnx.ModelProto, path: Path) -> None:
    """``head`` (a model without initializers), then ``model``'s initializers one record each."""
    with path.open("wb") as stream:
        stream.write(head.SerializeToString())
        for tensor in model.graph.initializer:
            data = tensor.SerializeToString()  # one tensor at a time, written without concatenating
            length = encode_varint(len(data))
            stream.write(_MODEL_GRAPH_TAG + encode_varint(len(_GRAPH_INITIALIZER_TAG) + len(length) + len(data)))
            stream.write(_GRAPH_INITIALIZER_TAG + length)
            stream.write(data)
            del data


def _without_initializers(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of the model whose main graph has no initializers (nothing else is large)."""
    import onnx

    head = onnx.ModelProto()
    _copy_fields(model, head, skip="graph")
    _copy_fields(model.graph, head.graph, skip="initializer")
    return head


def _copy_fields(source: Any, target: Any, *, skip: str) -> None:
    for field, value in source.ListFields():
        if field.name == skip:
            continue
        if field.is_repeated:
            getattr(target, field.name).extend(value)
        elif field.message_type is not None:
            getattr(target, field.name).CopyFrom(value)
        else:
            setattr(target, field.name, value)


def load_graph_only(path: Path) -> onnx.ModelProto:
    """A saved model without its external data (its weights stay in the file; the proto refers to them)."""
    return load_model(path, load_external_data=False)


def check_saved_model(path: Path) -> None:
    """onnx's checker through a file: the form that works above 2 GB (external data read tensor by tensor)."""
    import onnx

    try:
        onnx.checker.check_model(str(path))
    except onnx.checker.ValidationError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else repr(exc)
        raise ModelError(f"the model is not a valid ONNX graph: {first}") from None


def check_without_weights(model: onnx.ModelProto) -> None:
    """onnx's checker on a model whose weights it never copies: in memory, ``check_model`` serialises the whole
    model and parses it again in C++ (two more copies of every weight).  Here it checks, through a file, a light
    copy whose large tensors refer to a sparse data file of the right size (no bytes on disk or in memory);
    each large tensor's own byte count is compared with its type and shape here, one tensor at a time."""
    import tempfile


    light = light_copy(model)
    with tempfile.TemporaryDirectory(prefix="qdeploy-check-") as folder:
        offset = 0
        for stand_in in light.model.graph.initializer:
            tag = tag_of(stand_in)
            if tag is None:
                continue
            original = light.originals[tag]
            expected = tensor_nbytes(stand_in)
            if len(original.raw_data) != expected:  # what the checker would have said of the full tensor
                raise ModelError(f"the model is not a valid ONNX graph: initializer {stand_in.name!r} holds "
                                 f"{len(original.raw_data)} bytes; its type and shape need {expected}")
            _refer(stand_in, "weights.bin", offset, expected)
            offset += expected
        with (Path(folder) / "weights.bin").open("wb") as data:
            data.truncate(offset)  # sparse: the checker looks at the size only
        path = Path(folder) / "model.onnx"
        path.write_bytes(light.model.SerializeToString())
        check_saved_model(path)


def _stand_in(head: onnx.ModelProto, tensor: onnx.TensorProto) -> onnx.TensorProto:
    """A new initializer of ``head`` with ``tensor``'s name, type and shape, no data yet."""
    stand_in = head.graph.initializer.add()
    stand_in.name, stand_in.data_type = tensor.name, tensor.data_type
    stand_in.dims.extend(tensor.dims)
    return stand_in


def append_external(graph: onnx.GraphProto, name: str, array: np.ndarray, data: BinaryIO, location: str) -> None:
    """Add initializer ``name`` to ``graph`` as a reference to ``array``'s bytes, written at the end of ``data``
    (the open file ``location`` names, relative to the model): a contiguous array is written from its own memory,
    any other (a transposed view) through one contiguous copy."""
    import numpy as np
    import onnx

    tensor = graph.initializer.add()
    tensor.name, tensor.data_type = name, onnx.helper.np_dtype_to_tensor_dtype(array.dtype)
    tensor.dims.extend(array.shape)
    contiguous = np.ascontiguousarray(array)
    _refer(tensor, location, data.tell(), contiguous.nbytes)
    data.write(contiguous.data)


def _refer(tensor: onnx.TensorProto, location: str, offset: int, length: int) -> None:
    import onnx

    tensor.ClearField("raw_data")
    tensor.data_location = onnx.TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", str(offset)), ("length", str(length))):
        entry = tensor.external_data.add()
        entry.key, entry.value = key, value


COPY_CHUNK_BYTES = 16 << 20


def copy_exposing(source: Path, path: Path, outputs: list[onnx.ValueInfoProto]) -> None:
    """Write the model saved at ``source`` with ``outputs`` added to its graph outputs (those it has already are
    left as they are), its large weights copied file to file into ``<name>.data`` in 16 MB pieces: the weights
    are never in memory (the graph is)."""
    model = load_model(source, load_external_data=False)  # a one-file model's weights refer to the file too
    head = _without_initializers(model)
    present = {value.name for value in head.graph.output}
    head.graph.output.extend(value for value in outputs if value.name not in present)
    location = f"{path.name}.data"
    with (path.parent / location).open("wb") as data:
        for tensor in model.graph.initializer:
            entries = {entry.key: entry.value for entry in tensor.external_data}
            if "location" not in entries:  # in the proto (small)
                head.graph.initializer.append(tensor)
                continue
            length = _copy_bytes(source.parent / entries["location"], int(entries.get("offset", 0)),
                                 entries.get("length"), data)
            _refer(_stand_in(head, tensor), location, data.tell() - length, length)
    path.write_bytes(head.SerializeToString())


def _copy_bytes(source: Path, offset: int, length: str | None, target: Any) -> int:
    """Copy ``length`` bytes (to the end when None) of ``source`` from ``offset`` into the open ``target``."""
    copied = 0
    with source.open("rb") as stream:
        stream.seek(offset)
        remaining = int(length) if length is not None else None
        while remaining is None or remaining > 0:
            piece = stream.read(COPY_CHUNK_BYTES if remaining is None else min(COPY_CHUNK_BYTES, remaining))
            if not piece:
                break
            target.write(piece)
            copied += len(piece)
            if remaining is not None:
                remaining -= len(piece)
    return copied


def load_weights_from(model: onnx.ModelProto, folder: Path) -> None:
    """Read ``model``'s external tensors from their files in ``folder``, one at a time; each ends as a plain load
    leaves a tensor (onnx marks what it read ``data_location: DEFAULT``; a tensor loaded whole has no mark)."""
    import onnx

    external = [tensor for tensor in model.graph.initializer if tensor.data_location == onnx.TensorProto.EXTERNAL]
    onnx.load_external_data_for_model(model, str(folder))
    for tensor in external:
        tensor.ClearField("data_location")


def remove_saved(path: Path) -> None:
    """A saved model and its ``<name>.data`` file removed (scratch copies of the weights on disk)."""
    import contextlib

    for leftover in (path, path.with_name(f"{path.name}.data")):
        with contextlib.suppress(OSError):
            leftover.unlink(missing_ok=True)
