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


LONGEST_FILES = (
    "tests/pipeline/run/test_real_models.py",
    "tests/pipeline/run/test_large_models.py",
    "tests/stages/export/test_export_causal_lm_run.py",
    "tests/robustness/test_interruption.py",
    "tests/stages/fp16/test_fp16_models.py",
    "tests/pipeline/run/test_device_default.py",
    "tests/test_docs_examples.py",
    "tests/cli/test_cli.py",
    "tests/stages/fp16/test_fp16_real_draws.py",
    "tests/pipeline/run/test_report_schema.py",
)
"""The files that take a minute or more on 2 cores (``--durations``), longest first.  The two workers take whole
files (``--dist loadfile``) in collection order, so starting these first keeps one long file from running alone
at the end while the other worker idles."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    rank = {name: index for index, name in enumerate(LONGEST_FILES)}
    root = Path(str(config.rootpath))

    def order(item: pytest.Item) -> int:
        return rank.get(Path(str(item.path)).relative_to(root).as_posix(), len(rank))

    items.sort(key=order)  # stable: the other files, and the tests within a file, keep their order
