"""Reading a one-file ONNX model without holding its weights twice, from protobuf's wire format.

``onnx.load`` reads the whole file into one ``bytes`` object and parses it: two copies of every weight at the
peak, and a full copy even with ``load_external_data=False`` (a one-file model has nothing external).  Here the
file is memory-mapped and only the model's structure is parsed: every main-graph initializer whose
``raw_data`` is large becomes an external-data reference into the model file itself (``location`` the file's
name, ``offset`` where its bytes start).  The result is a graph-only model that onnx (``load_external_data_for_model``)
and ONNX Runtime read weights into one tensor at a time, as they do for a model saved with a data file.

The wire format is protobuf's: a field is a varint key (number << 3 | wire type) followed by a varint (type 0),
8 bytes (1), a varint length and that many bytes (2) or 4 bytes (5).  A model using anything else (groups) is
left to onnx.
"""

from __future__ import annotations

import mmap
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import onnx

__all__ = ["LOAD_MAPPED_ABOVE", "WIRE_MIN_BYTES", "WireFormatError", "encode_varint", "graph_only_bytes", "load_model"]

WIRE_MIN_BYTES = 1024
"""Initializers whose raw_data is this large or larger become references (onnx's own external-data threshold)."""

_MODEL_GRAPH = 7  # ModelProto.graph
_GRAPH_INITIALIZER = 5  # GraphProto.initializer
_TENSOR_RAW_DATA = 9  # TensorProto.raw_data
_TENSOR_EXTERNAL_DATA = 13  # TensorProto.external_data (StringStringEntryProto: key 1, value 2)
_TENSOR_DATA_LOCATION = 14  # TensorProto.data_location (EXTERNAL = 1)
_LEN = 2


class WireFormatError(ValueError):
    """The file is not a protobuf message this reader follows (it is left to onnx, which says why)."""


def graph_only_bytes(path: Path, min_bytes: int = WIRE_MIN_BYTES) -> bytes:
    """The serialised model at ``path`` with each large main-graph initializer's bytes replaced by a reference
    to where they lie in the file.  Parse the result with ``onnx.ModelProto.FromString``."""
    with path.open("rb") as stream, mmap.mmap(stream.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
        view = memoryview(mapped)
        try:
            return b"".join(_model(view, path.name, min_bytes))
        finally:
            view.release()


def _model(view: memoryview, location: str, min_bytes: int) -> Iterator[bytes]:
    for number, wire_type, start, end, value_start in _fields(view, 0, len(view)):
        if number == _MODEL_GRAPH and wire_type == _LEN:
            yield _length_delimited(number, b"".join(_graph(view, value_start, end, location, min_bytes)))
        else:
            yield bytes(view[start:end])


def _graph(view: memoryview, begin: int, stop: int, location: str, min_bytes: int) -> Iterator[bytes]:
    for number, wire_type, start, end, value_start in _fields(view, begin, stop):
        if number == _GRAPH_INITIALIZER and wire_type == _LEN:
            yield _length_delimited(number, _tensor(view, value_start, end, location, min_bytes))
        else:
            yield bytes(view[start:end])


def _tensor(view: memoryview, begin: int, stop: int, location: str, min_bytes: int) -> bytes:
    """A TensorProto whose large raw_data became an external-data reference into ``location``."""
    kept: list[bytes] = []
    reference = b""
    for number, wire_type, start, end, value_start in _fields(view, begin, stop):
        if number == _TENSOR_RAW_DATA and wire_type == _LEN and end - value_start >= min_bytes:
            reference = b"".join(_length_delimited(_TENSOR_EXTERNAL_DATA, _entry(key, value)) for key, value in
                                 (("location", location), ("offset", str(value_start)),
                                  ("length", str(end - value_start))))
            reference += _key(_TENSOR_DATA_LOCATION, 0) + b"\x01"
        else:
            kept.append(bytes(view[start:end]))
    return b"".join(kept) + reference


def _entry(key: str, value: str) -> bytes:
    return _length_delimited(1, key.encode()) + _length_delimited(2, value.encode())


def _fields(view: memoryview, begin: int, stop: int) -> Iterator[tuple[int, int, int, int, int]]:
    """(field number, wire type, field start, field end, value start) of each field in view[begin:stop]."""
    position = begin
    while position < stop:
        start = position
        key, position = _varint(view, position, stop)
        number, wire_type = key >> 3, key & 7
        value_start = position
        if wire_type == 0:
            _, position = _varint(view, position, stop)
        elif wire_type == 1:
            position += 8
        elif wire_type == _LEN:
            length, value_start = _varint(view, position, stop)
            position = value_start + length
        elif wire_type == 5:
            position += 4
        else:
            raise WireFormatError(f"wire type {wire_type} (field {number}) at byte {start}")
        if number == 0 or position > stop:
            raise WireFormatError(f"field {number} at byte {start} runs past its message")
        yield number, wire_type, start, position, value_start


def _varint(view: memoryview, position: int, stop: int) -> tuple[int, int]:
    value, shift = 0, 0
    while position < stop and shift < 64:
        byte = view[position]
        position += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, position
        shift += 7
    raise WireFormatError(f"unterminated varint before byte {position}")


def _key(number: int, wire_type: int) -> bytes:
    return encode_varint(number << 3 | wire_type)


def _length_delimited(number: int, payload: bytes) -> bytes:
    return _key(number, _LEN) + encode_varint(len(payload)) + payload


def encode_varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if not value:
            out.append(byte)
            return bytes(out)
        out.append(byte | 0x80)


LOAD_MAPPED_ABOVE = 64_000_000
"""Files from this size are read through ``graph_only_bytes``; smaller ones are parsed whole (it costs nothing)."""


def load_model(path: Path, *, load_external_data: bool = True) -> onnx.ModelProto:
    """``onnx.load`` with one copy of the weights at the peak instead of two.

    A one-file model from 64 MB is parsed without its large initializers, which then refer to their bytes in
    the file; with ``load_external_data`` they are read back one tensor at a time (with a data file's tensors),
    without it they stay references that onnx and ONNX Runtime can follow."""
    import onnx

    path = Path(path)
    if path.stat().st_size < LOAD_MAPPED_ABOVE:
        return onnx.load(str(path), load_external_data=load_external_data)
    try:
        model = onnx.ModelProto.FromString(graph_only_bytes(path))
    except (WireFormatError, ValueError, OSError):  # let onnx read it and say what is wrong
        return onnx.load(str(path), load_external_data=load_external_data)
    if load_external_data:
        _read_own_weights(model, path)
        onnx.load_external_data_for_model(model, str(path.parent))  # a data file's tensors, if any
    return model


def _read_own_weights(model: onnx.ModelProto, path: Path) -> None:
    """The initializers ``graph_only_bytes`` turned into references to the model file, read back one at a time
    (here, not through onnx, which refuses a model file reached through a symbolic link as a data file)."""
    with path.open("rb") as stream:
        for tensor in model.graph.initializer:
            entries = {entry.key: entry.value for entry in tensor.external_data}
            if entries.get("location") != path.name:
                continue
            stream.seek(int(entries["offset"]))
            tensor.raw_data = stream.read(int(entries["length"]))
            del tensor.external_data[:]
            tensor.ClearField("data_location")
