"""Issue 18, CLI polish: --version, every option's default in its help, option names never cut, the demo's
calibration and validation samples apart."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from tests.helpers.models import DEMO_RECIPE, REPO

COMMANDS = ("run", "compare", "check", "schema", "doctor", "sweep")
NO_DEFAULT = {"--help", "--version"}  # actions, not settings


def qdeploy(*args: str, columns: int = 80) -> subprocess.CompletedProcess[str]:
    env = {"COLUMNS": str(columns), "PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}
    return subprocess.run([sys.executable, "-m", "qdeploy.cli", *args], capture_output=True, text=True,
                          env=env, timeout=120)


def test_version_names_qdeploy_and_the_runtimes() -> None:
    done = qdeploy("--version")
    assert done.returncode == 0, done.stderr
    first, second = done.stdout.splitlines()[:2]
    assert re.fullmatch(r"qdeploy \d+\.\d+\.\d+\S*", first)
    for runtime in ("python", "onnx", "onnxruntime", "openvino"):
        assert re.search(rf"\b{runtime} \d", second), second


def _options(help_text: str) -> dict[str, str]:
    """Long option name -> its help entry (continuation lines joined)."""
    section = help_text.split("Options:", 1)[1]
    entries: dict[str, str] = {}
    current = None
    for line in section.splitlines():
        match = re.match(r"\s{2}(?:-\w, )?(--[\w-]+)", line)
        if match:
            current = match.group(1)
            entries[current] = line
        elif current and line.startswith(" " * 6):
            entries[current] += " " + line.strip()
        elif line.strip() and not line.startswith(" "):
            break
    return entries


@pytest.mark.parametrize("columns", [60, 80])
@pytest.mark.parametrize("command", COMMANDS)
def test_every_option_shows_its_default_and_its_whole_name(command: str, columns: int) -> None:
    done = qdeploy(command, "--help", columns=columns)
    assert done.returncode == 0, done.stderr
    options = _options(done.stdout)
    assert "--help" in options
    for name, entry in options.items():
        assert "…" not in entry and not re.search(rf"{re.escape(name[:6])}[\w-]*\.\.\.", entry), entry
        if name not in NO_DEFAULT:
            assert "[default:" in " ".join(entry.split()), f"{command} {name}: no default shown: {entry}"
    assert "[default: ." not in done.stdout  # rich markup used to eat "[default: runs/<name>/]"


def test_compare_help_keeps_long_option_names_at_60_columns() -> None:
    done = qdeploy("compare", "--help", columns=60)
    for name in ("--max-latency-regression", "--max-metric-drop", "--allow-mismatch"):
        assert name in done.stdout


def test_demo_calibrates_and_validates_on_different_samples() -> None:
    recipe = yaml.safe_load(DEMO_RECIPE.read_text())
    data = recipe["data"]
    calib_name = recipe["variants"]["int8"][1]["quantize"]["calibration"]["data"]
    calib = DEMO_RECIPE.parent / data[calib_name]["path"]
    val = DEMO_RECIPE.parent / data[recipe["validate"]["data"]]["path"]
    assert calib.resolve() != val.resolve()
    calib_samples = [np.load(path) for path in sorted(calib.glob("*.npy"))]
    val_samples = [np.load(path) for path in sorted(val.glob("*.npy"))]
    assert len(calib_samples) >= 8 and len(val_samples) >= 8
    assert not any(np.array_equal(a, b) for a in calib_samples for b in val_samples)


def test_demo_generator_writes_the_committed_files(tmp_path: Path) -> None:
    """make_demo_model.py is the source of the committed model and both sample sets (byte for byte)."""
    sys.path.insert(0, str(REPO / "recipes"))
    try:
        from make_demo_model import write_demo
    finally:
        sys.path.pop(0)
    write_demo(tmp_path)
    for relative in ("data/val/sample_00.npy", "data/calib/sample_15.npy", "data/calib/sample_00.npy"):
        assert (tmp_path / relative).read_bytes() == (REPO / "recipes" / relative).read_bytes(), relative


def test_onnx_runtimes_own_warnings_reach_stderr_only_with_verbose(tmp_path: Path) -> None:
    """Before: an opset-6 file (PyTorch 0.3's) printed ONNX Runtime's "only *guarantees* support for models stamped
    with opset version 7" and "Transpose optimizer failed" lines through every run, --quiet included, from sessions
    qdeploy does not create itself (ORT's quantizer's)."""
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 6)])
    model.ir_version = 3
    path = tmp_path / "old.onnx"
    path.write_bytes(model.SerializeToString())
    script = ("import sys, onnxruntime; from qdeploy.cli._common import setup_logging; "
              "setup_logging(False, sys.argv[1] == 'verbose'); "
              f"onnxruntime.InferenceSession({str(path)!r}, providers=['CPUExecutionProvider'])")
    quiet, verbose = (subprocess.run([sys.executable, "-c", script, mode], capture_output=True, text=True, check=True)
                      for mode in ("default", "verbose"))
    assert "opset version 7" in verbose.stderr  # the warning exists: the default hides it
    assert "onnxruntime" not in quiet.stderr, quiet.stderr


def test_a_failing_kernel_is_reported_once_by_qdeploy_not_again_by_onnx_runtimes_logger(tmp_path: Path) -> None:
    """Before: every failing run printed ORT's "[E:onnxruntime:...] Non-zero status code returned while running
    Gather node" besides the exception qdeploy turns into its own message (caustic-nmr: 15 such lines)."""
    from onnx import TensorProto, helper, numpy_helper

    table = numpy_helper.from_array(np.zeros((2, 3), np.float32), "table")
    graph = helper.make_graph([helper.make_node("Gather", ["table", "ids"], ["y"])], "g",
                              [helper.make_tensor_value_info("ids", TensorProto.INT64, [1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3])], [table])
    path = tmp_path / "gather.onnx"
    path.write_bytes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString())
    script = ("import sys, numpy, onnxruntime; from qdeploy.cli._common import setup_logging; "
              "setup_logging(False, sys.argv[1] == 'verbose'); "
              f"s = onnxruntime.InferenceSession({str(path)!r}, providers=['CPUExecutionProvider'])\n"
              "try:\n    s.run(None, {'ids': numpy.array([7])})\nexcept Exception as e:\n    print(type(e).__name__)")
    quiet, verbose = (subprocess.run([sys.executable, "-c", script, mode], capture_output=True, text=True, check=True)
                      for mode in ("default", "verbose"))
    assert quiet.stdout.strip() == verbose.stdout.strip() == "InvalidArgument"  # the failure still raises
    assert "out of data bounds" in verbose.stderr  # the line exists: the default hides it
    assert "onnxruntime" not in quiet.stderr, quiet.stderr
