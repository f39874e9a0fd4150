"""The image-folder reader: images streamed in name order, preprocessed as the recipe declares.

Each image is read with Pillow, converted to RGB (or one gray channel),
resized to [height, width] (bilinear; the model input's own size by default),
reordered to BGR when asked, then for float inputs scaled and normalised
(``(pixel * scale - mean) / std``) and laid out as NCHW or NHWC with a batch
dimension of 1.  Integer inputs (uint8 models) get the raw 0..255 pixels.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from qdeploy.calibration.readers import InputInfo, fit_to_input
from qdeploy.core.errors import DataError
from qdeploy.core.userfiles import files_in_folder, open_regular_file

if TYPE_CHECKING:
    from qdeploy.calibration.spec import DatasetSpec

__all__ = ["IMAGE_SUFFIXES", "check_image_input", "image_samples", "is_image"]

log = logging.getLogger(__name__)

IMAGE_SUFFIXES = frozenset({".png", ".jpg", ".jpeg", ".bmp", ".webp", ".tif", ".tiff", ".ppm", ".pgm"})


def image_samples(folder: Path, inputs: list[InputInfo], spec: DatasetSpec, *, limit: int | None = None,
                  dataset_name: str = "") -> Iterator[dict[str, np.ndarray]]:
    """Feeds {input: image tensor} from the image files of a folder, in name order."""
    label = f"dataset '{dataset_name}' ({folder})" if dataset_name else str(folder)
    if not folder.is_dir():
        raise DataError(f"{label}: folder does not exist; create it or fix 'path' in the recipe")
    files = files_in_folder(folder, is_image, f"dataset '{dataset_name or folder}'")
    if not files:
        raise DataError(f"{label}: no images ({', '.join(sorted(IMAGE_SUFFIXES))}) in the folder")
    info = _target_input(inputs, spec, label)
    height, width = _target_size(info, spec, label)
    _check_channels(info, spec, label)
    for path in files[:limit] if limit else files:
        yield {info.name: fit_to_input(_load(path, spec, height, width, info), info, path)}


def check_image_input(inputs: list[InputInfo], spec: DatasetSpec, label: str) -> None:
    """What the reader refuses before it opens an image: the input images feed, its size and its channels."""
    info = _target_input(inputs, spec, label)
    _target_size(info, spec, label)
    _check_channels(info, spec, label)


def is_image(path: Path) -> bool:
    return path.suffix.lower() in IMAGE_SUFFIXES


def _target_input(inputs: list[InputInfo], spec: DatasetSpec, label: str) -> InputInfo:
    names = [info.name for info in inputs]
    if spec.input is not None:
        if spec.input not in names:
            raise DataError(f"{label}: input '{spec.input}' is not a model input; the model has {names}")
        if len(inputs) > 1:
            raise DataError(f"{label}: images feed one input, but the model also needs "
                            f"{[n for n in names if n != spec.input]}; use npz samples for multi-input models")
        return inputs[0]
    if len(inputs) != 1:
        raise DataError(f"{label}: images feed one input; the model has {names}: use npz samples")
    return inputs[0]


def _spatial_axes(spec: DatasetSpec) -> tuple[int, int, int]:
    """(channel, height, width) axes of a rank-4 input in the declared layout."""
    return (1, 2, 3) if spec.layout == "NCHW" else (3, 1, 2)


def _target_size(info: InputInfo, spec: DatasetSpec, label: str) -> tuple[int, int]:
    if spec.resize is not None:
        return spec.resize[0], spec.resize[1]
    if len(info.shape) != 4:
        raise DataError(f"{label}: input '{info.name}' has rank {len(info.shape)}; images need a rank-4 input")
    _, height_axis, width_axis = _spatial_axes(spec)
    height, width = info.shape[height_axis], info.shape[width_axis]
    if height is None or width is None:
        raise DataError(f"{label}: input '{info.name}' has a symbolic height or width "
                        f"{[d if d is not None else '?' for d in info.shape]}; set resize: [height, width]")
    return height, width


def _check_channels(info: InputInfo, spec: DatasetSpec, label: str) -> None:
    channels = 1 if spec.color == "GRAY" else 3
    if len(info.shape) == 4:
        declared = info.shape[_spatial_axes(spec)[0]]
        if declared is not None and declared != channels:
            raise DataError(f"{label}: input '{info.name}' has {declared} channels in layout {spec.layout}; "
                            f"color {spec.color} gives {channels}: fix 'layout' or 'color'")


def _load(path: Path, spec: DatasetSpec, height: int, width: int, info: InputInfo) -> np.ndarray:
    try:
        from PIL import Image
    except ImportError as exc:
        raise DataError("reader 'images' needs Pillow: pip install pillow") from exc
    try:
        with open_regular_file(path, "image") as stream, Image.open(stream) as image:
            converted = image.convert("L" if spec.color == "GRAY" else "RGB")
            pixels = np.asarray(converted.resize((width, height), Image.Resampling.BILINEAR), dtype=np.float32)
    except (OSError, ValueError, Image.DecompressionBombError) as exc:  # a bomb: Pillow's pixel cap, not an OSError
        raise DataError(f"{path}: cannot read image: {exc}") from None
    except MemoryError:
        raise DataError(f"{path}: the image does not fit in memory") from None
    pixels = pixels[..., None] if pixels.ndim == 2 else pixels
    if spec.color == "BGR":
        pixels = pixels[..., ::-1]
    if np.issubdtype(info.dtype, np.floating):
        pixels = (pixels * spec.scale - np.asarray(spec.mean, np.float32)) / np.asarray(spec.std, np.float32)
    else:
        pixels = np.round(pixels).astype(info.dtype)
    if spec.layout == "NCHW":
        pixels = pixels.transpose(2, 0, 1)
    return np.ascontiguousarray(pixels[None])
