"""Shared test models and recipe helpers: tiny models built inline, written to tmp folders."""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest

from tests.helpers.models import tiny_cnn, write_recipe


@pytest.fixture
def tiny_model_path(tmp_path: Path) -> Path:
    path = tmp_path / "tiny.onnx"
    onnx.save(tiny_cnn(), path)
    return path


@pytest.fixture
def tiny_recipe(tmp_path: Path, tiny_model_path: Path) -> Path:
    """A fast recipe on the tiny CNN: fp32, fp16 and int8 on ort:cpu, small benchmark."""
    return write_recipe(tmp_path, """
        name: tiny
        model:
          onnx: tiny.onnx
        data:
          calib: {reader: random, samples: 8, seed: 1}
        variants:
          fp32: [simplify]
          fp16: [simplify, {fp16: {keep_io_types: true}}]
          int8: [simplify, {quantize: {mode: ptq, calibration: {data: calib}}}]
        targets: [ort:cpu]
        validate: {reference: fp32, samples: 4}
        benchmark: {batch_sizes: [1], warmup: 1, iterations: 5, rounds: 1, busy_seconds: 0}
        """)
