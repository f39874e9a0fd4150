"""A package's check.py as a shell user runs it: a reader that stops early (``python check.py | head -1``) costs
neither a traceback nor the exit status."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from qdeploy.pipeline.publish.package import check as package_check


@pytest.mark.parametrize("manifest", [
    {"files": {}, "model": {}, "check": {}},  # nothing listed: check.py itself is a file the manifest lacks
    {"files": {"model.onnx": {"sha256": "0" * 64, "size_bytes": 1}}, "model": {}, "check": {}},
])
def test_a_closed_pipe_ends_no_check_in_a_traceback(tmp_path: Path, manifest: dict) -> None:
    shutil.copy(package_check.__file__, tmp_path / "check.py")
    (tmp_path / package_check.MANIFEST).write_text(json.dumps(manifest))
    read, write = os.pipe()
    os.close(read)  # the reader is gone before the first line: every write meets a broken pipe
    try:
        done = subprocess.run([sys.executable, "check.py"], cwd=tmp_path, stdout=write, stderr=subprocess.PIPE,
                              text=True, timeout=120)
    finally:
        os.close(write)
    assert "Traceback" not in done.stderr and "BrokenPipeError" not in done.stderr, done.stderr
    assert done.returncode == 1  # the files do not match the manifest: the check failed, and says so by status


@pytest.mark.parametrize("value", [
    [{0: 0.25, 1: 0.75}, {0: 0.5, 1: 0.5}],  # ZipMap's probabilities, as ONNX Runtime hands them back
    [{"cat": 0.25, "dog": 0.75}],  # string classes
    [{0: 0.25}, {1: 0.75}],  # maps with other classes: left as they are
    [[1.0, 2.0], [3.0, 4.0]],
    ["cat", "dog"],
], ids=["int-classes", "string-classes", "uneven-maps", "numbers", "string-labels"])
def test_the_package_check_reads_an_output_as_validation_does(value: list) -> None:
    """check.py runs without qdeploy, so it carries its own copy of ``as_array``: the two must not drift."""
    import numpy as np

    from qdeploy.core.compare import as_array

    if value == ["cat", "dog"]:
        value = np.array(value, dtype=object)  # how ONNX Runtime hands back a string tensor
    ours, validation = package_check.numeric(value), as_array(value)
    assert ours.dtype == validation.dtype and ours.shape == validation.shape
    assert (ours == validation).all()
