"""Shared test models and recipe helpers: tiny models built inline, written to tmp folders."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import onnx
import pytest

from tests.helpers.models import tiny_cnn, write_recipe


@pytest.fixture(autouse=True)
def _qdeploy_log_level() -> Iterator[None]:
    """A CLI test's ``setup_logging`` sets the qdeploy logger's level for the whole process (ERROR with -q): restored
    after every test, or a later test in the same worker sees none of qdeploy's warnings in ``caplog`` (the iris
    test failed once so in the fast loop)."""
    logger = logging.getLogger("qdeploy")
    level = logger.level
    yield
    logger.setLevel(level)


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
