"""`qdeploy run` in a supervised child: a run's process ended by a signal (a native library's crash, the kernel's
out-of-memory killer) is reported with what the run had in hand, and a signal sent to the command reaches the run."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import onnx
import pytest

from qdeploy.cli.supervise import STACKS_FILE, crash_message
from qdeploy.pipeline.run.progress import WHERE_FILE
from tests.helpers.models import tiny_cnn, write_recipe

CRASH_SITE = Path(__file__).resolve().parents[1] / "helpers" / "crash_site"
RECIPE = """
name: crash
model: {onnx: model.onnx}
data:
  val: {reader: npy, path: val}
variants:
  fp32: [simplify]
targets: [ort:cpu]
validate: {data: val, reference: fp32}
benchmark: {enabled: false}
"""


def _recipe(folder: Path) -> Path:
    onnx.save(tiny_cnn(), folder / "model.onnx")
    (folder / "val").mkdir()
    np.save(folder / "val" / "end_here.npy", np.zeros((1, 3, 16, 16), np.float32))
    return write_recipe(folder, RECIPE)


def _qdeploy_run(folder: Path, how: str) -> subprocess.Popen[str]:
    """`qdeploy run` whose run process ends (``how``: segv, kill, hang) when it opens the validation sample."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(CRASH_SITE), os.environ.get("PYTHONPATH", "")]),
           "QDEPLOY_TEST_CRASH": how, "QDEPLOY_TEST_CRASH_ON": "end_here.npy", "TMPDIR": str(folder)}
    env.pop("QDEPLOY_NO_SUPERVISOR", None)
    return subprocess.Popen([sys.executable, "-m", "qdeploy", "run", str(_recipe(folder)), "-q", "--out",
                             str(folder / "out")], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _stacks_file(stderr: str) -> Path:
    line = next(line for line in stderr.splitlines() if STACKS_FILE in line)
    return Path(line.split(": ", 1)[1].split(" (", 1)[0])


def test_a_segmentation_fault_is_reported_with_what_the_run_had_in_hand(tmp_path: Path) -> None:
    run = _qdeploy_run(tmp_path, "segv")
    _, stderr = run.communicate(timeout=240)

    assert run.returncode == 1, stderr[-3000:]
    assert "ended by signal 11 (SIGSEGV, a segmentation fault)" in stderr
    stacks = _stacks_file(stderr)
    where = (stacks.parent / WHERE_FILE).read_text()
    assert where.startswith("simplify") and f'during "{where}"' in stderr  # the display's last line, kept by the run
    # the innermost frame (the crash), then qdeploy's innermost (the sample's first reader)
    assert "in ctypes/__init__.py:" in stderr and "called from core/userfiles.py:" in stderr
    assert "not an error in the recipe" in stderr and "Traceback" not in stderr
    assert "Fatal Python error: Segmentation fault" in stacks.read_text()
    assert _left_in_tmp(tmp_path) == [stacks.parent.name]  # the journal only: the run's work folder went with it
    assert sorted(path.name for path in stacks.parent.iterdir()) == [STACKS_FILE, WHERE_FILE]


def test_sigkill_names_the_out_of_memory_killer(tmp_path: Path) -> None:
    run = _qdeploy_run(tmp_path, "kill")
    _, stderr = run.communicate(timeout=240)

    assert run.returncode == 1, stderr[-3000:]
    assert "ended by signal 9 (SIGKILL)" in stderr and "out-of-memory killer" in stderr
    assert 'during "simplify' in stderr
    assert all(name.startswith("qdeploy-run-") for name in _left_in_tmp(tmp_path))  # no work folder, no model copy


def test_sigterm_to_the_command_stops_the_run(tmp_path: Path) -> None:
    """A cancelled CI job signals the command: the run must stop with it, not go on as an orphan."""
    run = _qdeploy_run(tmp_path, "hang")
    for _ in range(600):  # until the run waits in simplify's check, reading the sample
        if _run_processes(tmp_path) and _where(tmp_path).startswith("simplify"):
            break
        time.sleep(0.2)
    else:
        run.kill()
        pytest.fail("the run never reached the sample")
    run.send_signal(signal.SIGTERM)
    _, stderr = run.communicate(timeout=30)

    assert run.returncode == 128 + signal.SIGTERM, stderr[-3000:]
    assert "Traceback" not in stderr and "ended by signal" not in stderr  # stopped, not crashed
    time.sleep(0.5)
    assert _run_processes(tmp_path) == []  # the run did not go on as an orphan
    assert _left_in_tmp(tmp_path) == []  # nor left its work folders behind (SIGTERM skips the run's finally blocks)


def _left_in_tmp(folder: Path) -> list[str]:
    """What qdeploy left in the temporary folder the test gave it (``_qdeploy_run``'s TMPDIR)."""
    return sorted(path.name for path in folder.iterdir() if path.name.startswith("qdeploy-"))


def _run_processes(folder: Path) -> list[int]:
    """Processes whose command line names a file in ``folder`` (the supervisor and its run)."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if str(folder).encode() in cmdline.read_bytes():
                found.append(int(cmdline.parent.name))
        except OSError:
            continue
    return found


def _where(folder: Path) -> str:
    """The run's where-file: its journal folder is made in the test's TMPDIR (``_qdeploy_run``)."""
    found = next(folder.glob(f"qdeploy-run-*/{WHERE_FILE}"), None)
    return found.read_text() if found is not None else ""


def test_the_message_without_stacks_says_where_and_what_to_do(tmp_path: Path) -> None:
    (tmp_path / WHERE_FILE).write_text("benchmark › int8 · openvino:cpu · batch 1")

    message = crash_message(signal.SIGABRT, tmp_path)

    assert 'ended by signal 6 (SIGABRT, an abort) during "benchmark › int8 · openvino:cpu · batch 1".' in message
    assert "--variant, --target" in message and STACKS_FILE not in message
