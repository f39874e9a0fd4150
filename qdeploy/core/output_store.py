"""A run's outputs, held in memory up to a limit and in ``.npy`` files beyond it.

Validation keeps the reference's outputs for every pair, the noise floor's to the end, and each candidate's
until they are compared.  For a language model those are eight windows of logits over a 49,152-token vocabulary
(0.25 GB a run): held in memory they sat beside the next session's weights and set the run's peak.  Past
``KEEP_IN_MEMORY_BYTES`` a run's samples are written to a temporary folder as they come, and each is read back
one array at a time when asked (``DiskSample``), so a comparison holds one sample's arrays, not every sample's.
Small models never reach the limit: their outputs stay plain dicts in memory, as before.

The folder goes away with the last sample that reads from it (``weakref.finalize``), and with the evaluation's
own temporary folder in any case.
"""

from __future__ import annotations

import shutil
import tempfile
import weakref
from collections.abc import Iterator, Mapping
from pathlib import Path

import numpy as np

__all__ = ["KEEP_IN_MEMORY_BYTES", "DiskSample", "OutputStore"]

KEEP_IN_MEMORY_BYTES = 64_000_000
"""A run's outputs up to this many bytes stay in memory; later samples go to disk."""


class _Folder:
    """A temporary folder that is removed once nothing refers to it any more."""

    def __init__(self, parent: Path) -> None:
        parent.mkdir(parents=True, exist_ok=True)
        self.path = Path(tempfile.mkdtemp(prefix="outputs-", dir=parent))
        weakref.finalize(self, shutil.rmtree, self.path, True)


class DiskSample(Mapping[str, np.ndarray]):
    """One sample's outputs, saved as one ``.npy`` file per output and loaded again on each lookup."""

    __slots__ = ("_files", "_folder")

    def __init__(self, folder: _Folder, files: dict[str, Path]) -> None:
        self._folder = folder  # keeps the folder (and its files) alive as long as this sample
        self._files = files

    def __getitem__(self, name: str) -> np.ndarray:
        return np.load(self._files[name], allow_pickle=False)

    def __contains__(self, name: object) -> bool:
        return name in self._files  # Mapping's own would load the array to answer

    def __iter__(self) -> Iterator[str]:
        return iter(self._files)

    def __len__(self) -> int:
        return len(self._files)

    def __repr__(self) -> str:
        return f"DiskSample({list(self._files)} in {self._folder.path})"


class OutputStore:
    """Samples added one at a time: kept as given while their bytes stay under ``keep_bytes``, saved to a
    temporary folder under ``parent`` after that (no ``parent``: everything stays in memory; no ``keep_bytes``:
    ``KEEP_IN_MEMORY_BYTES``)."""

    def __init__(self, parent: Path | None, keep_bytes: int | None = None) -> None:
        self.samples: list[Mapping[str, np.ndarray]] = []
        self._parent, self._held = parent, 0
        self._keep_bytes = KEEP_IN_MEMORY_BYTES if keep_bytes is None else keep_bytes
        self._folder: _Folder | None = None

    def add(self, sample: Mapping[str, np.ndarray]) -> None:
        size = sum(value.nbytes for value in sample.values() if isinstance(value, np.ndarray))
        if self._parent is None or self._held + size <= self._keep_bytes or not _savable(sample):
            self._held += size
            self.samples.append(sample)
            return
        self.samples.append(self._save(sample))

    def _save(self, sample: Mapping[str, np.ndarray]) -> DiskSample:
        assert self._parent is not None
        if self._folder is None:
            self._folder = _Folder(self._parent)
        index = len(self.samples)
        files = {}
        for position, (name, array) in enumerate(sample.items()):
            path = self._folder.path / f"{index}-{position}.npy"  # output names may hold any character
            np.save(path, array, allow_pickle=False)
            files[name] = path
        return DiskSample(self._folder, files)


def _savable(sample: Mapping[str, np.ndarray]) -> bool:
    """Numeric arrays only: anything else (an ORT sequence or map output, a string tensor) stays in memory."""
    return all(isinstance(value, np.ndarray) and value.dtype.kind in "biufc" for value in sample.values())
