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
