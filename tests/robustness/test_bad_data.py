"""Bad data: empty folders, samples that do not fit the model, NaN: exit 2, naming the file and the input."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.robustness.helpers import assert_clean_input_error, recipe_with_model, run_cli

BODY = """
name: r
model: {onnx: MODEL}
data:
  calib: {reader: npy, path: calib}
variants:
  fp32: [simplify]
  int8: [simplify, {quantize: {calibration: {data: calib}}}]
targets: [ort:cpu]
validate: {reference: fp32, samples: 2}
benchmark: {enabled: false}
"""


def _run_with_samples(tmp_path: Path, samples: dict[str, np.ndarray]) -> tuple[Path, object]:
    folder = tmp_path / "calib"
    folder.mkdir()
    for name, array in samples.items():
        np.save(folder / name, array)
    recipe = recipe_with_model(tmp_path, body=BODY)
    return recipe, run_cli("run", str(recipe), "-q", "--out", str(tmp_path / "o"))


def test_empty_calibration_folder(tmp_path: Path) -> None:
    _, result = _run_with_samples(tmp_path, {})
    assert_clean_input_error(result, "calib", "no .npy or .npz samples")


@pytest.mark.slow  # the same refusal runs on the fast loop in test_bad_data_fails_one_variant_and_keeps_the_others
def test_sample_of_the_wrong_shape(tmp_path: Path) -> None:
    _, result = _run_with_samples(tmp_path, {"a.npy": np.zeros((3, 8, 8), np.float32)})
    assert_clean_input_error(result, "a.npy", "input 'input'", "[1, 3, 16, 16]")


def test_sample_of_the_wrong_dtype(tmp_path: Path) -> None:
    _, result = _run_with_samples(tmp_path, {"a.npy": np.zeros((3, 16, 16), np.int64)})
    assert_clean_input_error(result, "a.npy", "int64", "float32")


def test_nan_in_calibration_data(tmp_path: Path) -> None:
    sample = np.zeros((3, 16, 16), np.float32)
    sample[0, 1, 2] = np.nan
    _, result = _run_with_samples(tmp_path, {"a.npy": np.zeros((3, 16, 16), np.float32), "b.npy": sample})
    assert_clean_input_error(result, "b.npy", "NaN")


def test_bad_data_fails_one_variant_and_keeps_the_others(tmp_path: Path) -> None:
    import json

    _, _result = _run_with_samples(tmp_path, {"a.npy": np.zeros((3, 8, 8), np.float32)})
    report = json.loads((tmp_path / "o" / "report.json").read_text())
    assert [a["name"] for a in report["artifacts"]] == ["fp32"]
    assert report["failures"][0]["variant"] == "int8" and report["failures"][0]["kind"] == "input"
