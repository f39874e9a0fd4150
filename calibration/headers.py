"""A dataset checked against the model's inputs from its files' headers, before anything is run (``qdeploy check``).

The readers (``readers.npy_samples``, ``images.image_samples``) refuse a sample of the wrong shape or dtype when a
stage reads it, minutes into a run.  Here the same refusals come from what costs no data: the header of each .npy
array (an .npz's members too), and for images the model input's rank, size and channels against the declared
preprocessing.  The values themselves (NaN, Inf, pixels) are left to the readers.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from qdeploy.calibration.images import IMAGE_SUFFIXES, check_image_input, is_image
from qdeploy.calibration.readers import InputInfo, is_npy_sample, sample_limit, sample_mismatch
from qdeploy.core.arrayfiles import Header, npy_header, npz_headers
from qdeploy.core.errors import DataError
from qdeploy.core.userfiles import files_in_folder, open_regular_file

if TYPE_CHECKING:
    from qdeploy.calibration.spec import DatasetSpec

__all__ = ["MAX_CHECKED_SAMPLES", "check_dataset_fits"]

MAX_CHECKED_SAMPLES = 10_000
"""Most sample files whose headers are read (0.18 ms each for 2,000 .npy files on 2 shared cores, so about 2 s);
the readers check any beyond as they read them."""


def check_dataset_fits(name: str, spec: DatasetSpec, folder: Path, inputs: Sequence[InputInfo]) -> None:
    """DataError naming the dataset, its file, the input, and the expected and found shape or dtype, for the first
    sample (of those a run may read) that the readers would refuse."""
    label = f"dataset '{name}' ({folder})"
    if spec.reader == "images":
        if not files_in_folder(folder, is_image, f"dataset '{name}'"):
            raise DataError(f"{label}: no images ({', '.join(sorted(IMAGE_SUFFIXES))}) in the folder")
        check_image_input(list(inputs), spec, label)
        return
    if spec.reader == "text":  # tokenizing is the reader's work: here, the file only
        if not folder.is_file():
            raise DataError(f"{label}: no such text file; fix 'path' in the recipe")
        return
    if spec.reader != "npy":
        return  # random data is shaped from the model itself
    files = files_in_folder(folder, is_npy_sample, f"dataset '{name}'")
    if not files:
        raise DataError(f"{label}: no .npy or .npz samples in the folder")
    if any(path.suffix == ".npy" for path in files) and len(inputs) != 1:
        raise DataError(f"{label}: .npy samples serve one-input models only; this model has inputs "
                        f"{[info.name for info in inputs]}: use .npz files keyed by input name")
    for path in files[:min(spec.samples or MAX_CHECKED_SAMPLES, MAX_CHECKED_SAMPLES)]:
        headers = _headers(path, inputs)
        for info in inputs:
            if info.name not in headers:
                raise DataError(f"dataset '{name}': {path}: no array for model input '{info.name}'; the file holds "
                                f"{sorted(headers)}")
            problem = sample_mismatch(*headers[info.name], info)
            if problem is not None:
                raise DataError(f"dataset '{name}': {path}: {problem}")


def _headers(path: Path, inputs: Sequence[InputInfo]) -> dict[str, Header]:
    """Array name -> (shape, dtype) from the headers; an .npy sample's array is named after the only input.  The
    one checked loader's header checks (qdeploy.core.arrayfiles): pickles and claims beyond the file refused."""
    if path.suffix == ".npz":
        return npz_headers(path, "sample", sample_limit())
    with open_regular_file(path, "sample") as stream:
        return {inputs[0].name: npy_header(stream, path, os.fstat(stream.fileno()).st_size, path.name,
                                           sample_limit())}
