"""The files of ``mode: weight_only``: the source model's initializers read lazily (external data through a
read-only memory map), and the output's one data file, tensors appended at aligned offsets."""

from __future__ import annotations

import mmap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

__all__ = ["ALIGN", "COPY_CHUNK", "DataFile", "Weights"]

ALIGN = 4096
COPY_CHUNK = 64 << 20


class Weights:
    """Initializers of the source model, read lazily: external ones through a read-only memory map."""

    def __init__(self, model: onnx.ModelProto, folder: Path) -> None:
        self.folder = folder
        self.by_name = {init.name: init for init in model.graph.initializer}
        self._maps: dict[str, mmap.mmap] = {}
        self.transposed: dict[str, str] = {}
        """Output of a Transpose of a 2-D initializer -> that initializer (a tied LM head reads the embedding
        table through one): read as the table transposed, a view, never a second copy."""
        self.row_scales: dict[str, np.ndarray] = {}
        """Weight -> the scales its rows are multiplied by when read (``awq``: its input is divided by them)."""

    def dims(self, name: str) -> list[int]:
        if name in self.transposed:
            return list(reversed(self.by_name[self.transposed[name]].dims))
        return list(self.by_name[name].dims)

    def array(self, name: str) -> np.ndarray:
        if name in self.row_scales:
            stored = self._stored(name)
            return (stored * self.row_scales[name][:, None]).astype(stored.dtype)
        return self._stored(name)

    def _stored(self, name: str) -> np.ndarray:
        if name in self.transposed:
            return self.array(self.transposed[name]).T
        tensor = self.by_name[name]
        if tensor.data_location != TensorProto.EXTERNAL:
            return numpy_helper.to_array(tensor)
        info = {entry.key: entry.value for entry in tensor.external_data}
        dtype = helper.tensor_dtype_to_np_dtype(tensor.data_type)
        count = int(np.prod(tensor.dims)) if tensor.dims else 1
        return np.frombuffer(self._map(info["location"]), dtype=dtype, count=count,
                             offset=int(info.get("offset", 0))).reshape(tuple(tensor.dims))

    def raw_pieces(self, name: str) -> Iterator[memoryview | bytes]:
        """The tensor's bytes in pieces of at most COPY_CHUNK (file to file for external data)."""
        tensor = self.by_name[name]
        if tensor.data_location != TensorProto.EXTERNAL:
            yield numpy_helper.to_array(tensor).tobytes()
            return
        info = {entry.key: entry.value for entry in tensor.external_data}
        buffer = memoryview(self._map(info["location"]))
        start = int(info.get("offset", 0))
        length = int(info["length"]) if "length" in info else len(buffer) - start
        for offset in range(start, start + length, COPY_CHUNK):
            yield buffer[offset:min(offset + COPY_CHUNK, start + length)]

    def release(self, name: str) -> None:
        """Drop a weight's mapped pages from this process (they stay in the page cache): read once, they would
        count as its memory to the end, the whole float model by the last weight.  A later read faults them in
        again."""
        tensor = self.by_name.get(self.transposed.get(name, name))
        if tensor is None or tensor.data_location != TensorProto.EXTERNAL or not hasattr(mmap, "MADV_DONTNEED"):
            return
        info = {entry.key: entry.value for entry in tensor.external_data}
        buffer = self._map(info["location"])
        start = int(info.get("offset", 0))
        end = start + int(info["length"]) if "length" in info else len(buffer)
        begin = start - start % mmap.PAGESIZE
        if end > begin:
            buffer.madvise(mmap.MADV_DONTNEED, begin, min(end, len(buffer)) - begin)

    def _map(self, location: str) -> mmap.mmap:
        if location not in self._maps:
            with (self.folder / location).open("rb") as stream:
                self._maps[location] = mmap.mmap(stream.fileno(), 0, access=mmap.ACCESS_READ)
        return self._maps[location]


class DataFile:
    """The output's one data file: tensors appended at 4 KiB-aligned offsets."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.stream = path.open("wb")

    def add(self, name: str, data_type: int, dims: list[int], pieces: Any) -> TensorProto:
        offset = self.stream.tell()
        pad = (-offset) % ALIGN
        self.stream.write(b"\0" * pad)
        offset += pad
        for piece in pieces:
            self.stream.write(piece)
        tensor = TensorProto(name=name, data_type=data_type, dims=dims, data_location=TensorProto.EXTERNAL)
        for key, value in (("location", self.path.name), ("offset", str(offset)),
                           ("length", str(self.stream.tell() - offset))):
            entry = tensor.external_data.add()
            entry.key, entry.value = key, value
        return tensor

    def close(self) -> None:
        self.stream.flush()
        self.stream.close()
