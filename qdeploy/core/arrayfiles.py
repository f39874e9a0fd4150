"""The one checked loader of the .npy and .npz files a user gives qdeploy (dataset samples, labels, frozen values).

numpy trusts an array's header: a 190-byte file whose header claims 10^12 elements makes ``np.load`` allocate
7 TB (a MemoryError) or a zip member claiming gigabytes makes it decompress them.  Here each array's header is read
first and refused, naming the file, the member and the cause (``DataError``, exit 2), when it holds Python objects
(a pickle, which qdeploy never loads), claims more bytes than its file holds (truncated or damaged), or more than
the caller allows; only then is it loaded, with ``allow_pickle=False``.
"""

from __future__ import annotations

import math
import os
import zipfile
from collections.abc import Callable, Collection
from pathlib import Path
from typing import BinaryIO, TypeVar

import numpy as np

from qdeploy.core.errors import DataError
from qdeploy.core.userfiles import open_regular_file

__all__ = ["ArrayLimit", "Header", "fmt_bytes", "load_npy", "load_npz", "npy_header", "npz_headers"]

Header = tuple[tuple[int, ...], np.dtype]
ArrayLimit = tuple[int, str]
"""(bytes, what they are: 'one sample may take (1.2 GB, a quarter of the memory available now)')."""
_MAX_HEADER = 10_000
_T = TypeVar("_T")


def fmt_bytes(count: float) -> str:
    """A size for a message: '49.2 KB', '7.3 TB'."""
    for unit, size in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6)):
        if count >= size:
            return f"{count / size:.1f} {unit}"
    return f"{count / 1e3:.1f} KB"


def npy_header(stream: BinaryIO, path: Path, size: int, member: str, limit: ArrayLimit | None = None) -> Header:
    """The shape and dtype an array's header declares (``stream`` at its start, ``size`` its bytes); DataError
    when it holds Python objects, claims more data than it holds, or more bytes than ``limit`` allows."""
    from numpy.lib import format as npy

    try:
        version = npy.read_magic(stream)
        if version == (1, 0):
            shape, _, dtype = npy.read_array_header_1_0(stream, max_header_size=_MAX_HEADER)
        elif version == (2, 0):
            shape, _, dtype = npy.read_array_header_2_0(stream, max_header_size=_MAX_HEADER)
        else:  # 3.0, UTF-8 header; numpy has no public reader for it
            shape, _, dtype = npy._read_array_header(stream, version, max_header_size=_MAX_HEADER)
    except (ValueError, EOFError, OSError) as exc:
        raise DataError(f"{path}: '{member}' is not a .npy array ({exc}); save it with numpy.save") from None
    if dtype.hasobject:
        raise DataError(f"{path}: '{member}' holds Python objects (a pickle), which qdeploy never loads; save "
                        "numeric arrays")
    claimed = math.prod(shape) * dtype.itemsize
    held = size - stream.tell()
    if claimed > held:
        raise DataError(f"{path}: '{member}' claims shape {list(shape)} {dtype} ({fmt_bytes(claimed)}) but holds "
                        f"{fmt_bytes(max(held, 0))} of data: the file is truncated or damaged")
    if limit is not None and claimed > limit[0]:
        raise DataError(f"{path}: '{member}' is {list(shape)} {dtype} ({fmt_bytes(claimed)}), more than {limit[1]}")
    return tuple(shape), dtype


def load_npy(path: Path, what: str, limit: ArrayLimit | None = None) -> np.ndarray:
    """The array of a regular .npy file, its header checked first (``npy_header``)."""
    with open_regular_file(path, what) as stream:
        npy_header(stream, path, os.fstat(stream.fileno()).st_size, path.name, limit)
        stream.seek(0)
        return _loaded(lambda: np.load(stream, allow_pickle=False), path)


def npz_headers(path: Path, what: str, limit: ArrayLimit | None = None) -> dict[str, Header]:
    """Array name -> (shape, dtype) of every member of a regular .npz file, from the headers alone."""
    with open_regular_file(path, what) as stream:
        return _checked_members(stream, path, limit)


def load_npz(path: Path, what: str, limit: ArrayLimit | None = None,
             keys: Collection[str] | None = None) -> dict[str, np.ndarray]:
    """The arrays of a regular .npz file (only ``keys`` where given, those it holds), every member's header
    checked first; ``limit`` bounds each array."""
    with open_regular_file(path, what) as stream:
        names = _checked_members(stream, path, limit)
        stream.seek(0)
        wanted = [name for name in names if keys is None or name in keys]
        return _loaded(lambda: _read_members(stream, wanted), path)


def _checked_members(stream: BinaryIO, path: Path, limit: ArrayLimit | None) -> dict[str, Header]:
    headers = {}
    try:
        with zipfile.ZipFile(stream) as archive:
            for member in archive.infolist():
                if not member.filename.endswith(".npy"):
                    raise DataError(f"{path}: member '{member.filename}' is not an array (.npy); an .npz holds "
                                    "arrays only")
                with archive.open(member) as inner:
                    headers[member.filename.removesuffix(".npy")] = npy_header(inner, path, member.file_size,
                                                                               member.filename, limit)
    except (zipfile.BadZipFile, zipfile.LargeZipFile, NotImplementedError, OSError, EOFError) as exc:
        raise DataError(f"{path}: not a readable .npz archive ({exc}); save it with numpy.savez") from None
    return headers


def _read_members(stream: BinaryIO, names: list[str]) -> dict[str, np.ndarray]:
    with np.load(stream, allow_pickle=False) as archive:
        return {name: archive[name] for name in names}


def _loaded(load: Callable[[], _T], path: Path) -> _T:
    """What ``load()`` returns; what numpy still refuses (a damaged body) as a DataError naming the file."""
    try:
        return load()
    except (ValueError, OSError, EOFError, zipfile.BadZipFile) as exc:
        raise DataError(f"{path}: cannot read the array: {exc}") from None
    except MemoryError:
        raise DataError(f"{path}: the array does not fit in memory") from None
