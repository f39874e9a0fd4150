"""The one checked loader of users' .npy/.npz files: headers are read and refused before numpy allocates."""

from __future__ import annotations

import io
import zipfile
from pathlib import Path

import numpy as np
import pytest

from qdeploy.core.arrayfiles import load_npy, load_npz, npz_headers
from qdeploy.core.errors import DataError


def claiming(shape: tuple[int, ...], descr: str = "<f4") -> bytes:
    """A .npy of a few bytes whose header claims ``shape``."""
    header = f"{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape}, }}"
    header += " " * (117 - len(header)) + "\n"
    return b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header.encode() + bytes(64)


def npz_of(path: Path, members: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return path


def npy_bytes(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=True)
    return buffer.getvalue()


def test_a_header_claiming_more_than_the_file_holds_is_refused_before_loading(tmp_path: Path) -> None:
    (tmp_path / "a.npy").write_bytes(claiming((10**6, 10**6)))
    with pytest.raises(DataError, match=r"a\.npy: 'a\.npy' claims shape \[1000000, 1000000\] float32 \(4\.0 TB\) "
                                        r"but holds 64 bytes|holds 0\.1 KB"):
        load_npy(tmp_path / "a.npy", "sample")


def test_an_npz_member_claiming_more_than_it_holds_is_refused(tmp_path: Path) -> None:
    path = npz_of(tmp_path / "a.npz", {"x.npy": npy_bytes(np.zeros(3, np.float32)),
                                       "label.npy": claiming((10**6, 10**6), "<i8")})
    for read in (npz_headers, load_npz):
        with pytest.raises(DataError, match=r"a\.npz: 'label\.npy' claims shape \[1000000, 1000000\] int64"):
            read(path, "sample")


def test_pickles_are_refused_by_name_and_never_loaded(tmp_path: Path) -> None:
    (tmp_path / "a.npy").write_bytes(npy_bytes(np.array([{"a": 1}], dtype=object)))
    with pytest.raises(DataError, match=r"'a\.npy' holds Python objects \(a pickle\), which qdeploy never loads"):
        load_npy(tmp_path / "a.npy", "sample")
    path = npz_of(tmp_path / "a.npz", {"x.npy": npy_bytes(np.array([None], dtype=object))})
    with pytest.raises(DataError, match=r"'x\.npy' holds Python objects"):
        load_npz(path, "sample")


def test_a_limit_bounds_each_array_and_good_files_load(tmp_path: Path) -> None:
    np.save(tmp_path / "a.npy", np.arange(1000, dtype=np.int64))
    with pytest.raises(DataError, match=r"is \[1000\] int64 \(8\.0 KB\), more than a frozen value may take"):
        load_npy(tmp_path / "a.npy", "value", (4000, "a frozen value may take (4 KB)"))
    assert load_npy(tmp_path / "a.npy", "value").sum() == 499500
    np.savez(tmp_path / "b.npz", x=np.ones(2), label=np.array(3))
    assert sorted(load_npz(tmp_path / "b.npz", "sample")) == ["label", "x"]
    assert list(load_npz(tmp_path / "b.npz", "sample", keys=["label", "y"])) == ["label"]
    assert npz_headers(tmp_path / "b.npz", "sample") == {"x": ((2,), np.dtype("float64")),
                                                         "label": ((), np.dtype("int64"))}


def test_text_that_is_not_an_array_is_a_data_error(tmp_path: Path) -> None:
    (tmp_path / "a.npy").write_text("hello")
    with pytest.raises(DataError, match=r"a\.npy: 'a\.npy' is not a \.npy array"):
        load_npy(tmp_path / "a.npy", "sample")
    (tmp_path / "a.npz").write_text("hello")
    with pytest.raises(DataError, match=r"a\.npz: not a readable \.npz archive"):
        load_npz(tmp_path / "a.npz", "sample")
