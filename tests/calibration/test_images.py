"""The image-folder reader: declared resize, normalisation, channel order and layout; clear errors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from PIL import Image
from pydantic import ValidationError

from qdeploy.calibration.samples import iter_samples
from qdeploy.core.errors import DataError
from qdeploy.pipeline.recipe.schema import DatasetSpec


def model_with_input(tmp_path: Path, shape: list[object], elem: int = TensorProto.FLOAT) -> Path:
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", elem, shape)],
                              [helper.make_tensor_value_info("y", elem, shape)])
    path = tmp_path / "m.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), str(path))
    return path


def image_folder(tmp_path: Path, count: int = 3, size: tuple[int, int] = (40, 30)) -> Path:
    """count images of size (width, height): red left half, blue right half."""
    folder = tmp_path / "images"
    folder.mkdir()
    pixels = np.zeros((size[1], size[0], 3), np.uint8)
    pixels[:, : size[0] // 2, 0] = 200
    pixels[:, size[0] // 2:, 2] = 100
    for index in range(count):
        Image.fromarray(pixels).save(folder / f"img{index}.png")
    (folder / "notes.txt").write_text("not an image")
    return folder


def read(tmp_path: Path, model: Path, limit: int | None = None, **fields: object) -> list[dict[str, np.ndarray]]:
    spec = DatasetSpec(reader="images", path="images", **fields)
    return list(iter_samples(spec, model, resolve=lambda p: tmp_path / p, limit=limit, dataset_name="imgs"))


def test_images_are_resized_normalised_and_laid_out_nchw(tmp_path: Path) -> None:
    image_folder(tmp_path)
    feeds = read(tmp_path, model_with_input(tmp_path, [1, 3, 8, 16]), mean=[0.5, 0.5, 0.5], std=[0.25, 0.5, 0.5])
    assert len(feeds) == 3
    x = feeds[0]["x"]
    assert x.shape == (1, 3, 8, 16) and x.dtype == np.float32
    np.testing.assert_allclose(x[0, 0, :, 2], (200 / 255 - 0.5) / 0.25, rtol=1e-5)  # red, left half
    np.testing.assert_allclose(x[0, 2, :, 13], (100 / 255 - 0.5) / 0.5, rtol=1e-5)  # blue, right half


def test_bgr_nhwc_and_an_explicit_resize(tmp_path: Path) -> None:
    image_folder(tmp_path)
    feeds = read(tmp_path, model_with_input(tmp_path, ["n", "h", "w", 3]), limit=2, layout="NHWC", color="BGR",
                 resize=[6, 10], scale=1.0)
    assert len(feeds) == 2
    x = feeds[0]["x"]
    assert x.shape == (1, 6, 10, 3)
    assert x[0, 0, 0, 2] == pytest.approx(200.0) and x[0, 0, 0, 0] == pytest.approx(0.0)  # red is last in BGR


def test_uint8_inputs_get_raw_pixels_and_gray_gets_one_channel(tmp_path: Path) -> None:
    image_folder(tmp_path)
    feeds = read(tmp_path, model_with_input(tmp_path, [1, 1, 5, 5], TensorProto.UINT8), color="GRAY")
    x = feeds[0]["x"]
    assert x.dtype == np.uint8 and x.shape == (1, 1, 5, 5) and 0 < int(x.max()) <= 255


@pytest.mark.parametrize(("shape", "fields", "message"), [
    ([1, 3, "h", "w"], {}, r"symbolic height or width .*set resize"),
    ([1, 1, 8, 8], {}, "has 1 channels in layout NCHW; color RGB gives 3"),
    ([1, 3, 8, 8], {"input": "z"}, r"input 'z' is not a model input"),
])
def test_mismatches_are_data_errors(tmp_path: Path, shape: list[object], fields: dict, message: str) -> None:
    image_folder(tmp_path)
    with pytest.raises(DataError, match=message):
        read(tmp_path, model_with_input(tmp_path, shape), **fields)


def test_unreadable_image_names_the_file(tmp_path: Path) -> None:
    folder = image_folder(tmp_path)
    (folder / "broken.png").write_bytes(b"not a png")
    with pytest.raises(DataError, match=r"broken\.png: cannot read image"):
        read(tmp_path, model_with_input(tmp_path, [1, 3, 8, 8]))


def test_folder_without_images_is_a_data_error(tmp_path: Path) -> None:
    (tmp_path / "images").mkdir()
    with pytest.raises(DataError, match="no images"):
        read(tmp_path, model_with_input(tmp_path, [1, 3, 8, 8]))


@pytest.mark.parametrize("fields", [
    {"reader": "npy", "path": "d", "resize": [8, 8]},
    {"reader": "images"},
    {"reader": "images", "path": "d", "resize": [8]},
    {"reader": "images", "path": "d", "mean": [0.1, 0.2]},
    {"reader": "images", "path": "d", "std": [0.0]},
    {"reader": "images", "path": "d", "color": "GRAY", "mean": [0.1, 0.2, 0.3]},
])
def test_bad_image_specs_are_rejected(fields: dict) -> None:
    with pytest.raises(ValidationError):
        DatasetSpec(**fields)
