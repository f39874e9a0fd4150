"""Issue 18, reproducible installs: constraints.txt pins what was tested, the package ships the same list, and
`qdeploy doctor` warns when the installed versions differ."""

from __future__ import annotations

import json
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

from qdeploy.pipeline.results import tested_versions
from qdeploy.pipeline.results.tested_versions import TESTED, difference_lines, read_constraints, version_differences
from tests.helpers.models import REPO


def test_constraints_file_and_shipped_list_agree() -> None:
    assert read_constraints(REPO / "constraints.txt") == TESTED
    for runtime in ("onnx", "onnxruntime", "openvino", "numpy", "onnxconverter-common"):
        assert runtime in TESTED


def test_package_requirements_stay_ranges() -> None:
    text = (REPO / "pyproject.toml").read_text()
    requirements = text[text.index("dependencies = ["):text.index("[project.scripts]")]
    assert '"onnxruntime>=' in requirements and "==" not in requirements


def test_read_constraints_names_a_bad_line(tmp_path: Path) -> None:
    path = tmp_path / "c.txt"
    path.write_text("# header\nonnx==1.2.3  # comment\nOnnx_Runtime==1.0\nnumpy>=1\n")
    with pytest.raises(ValueError, match=r"c.txt:4: expected 'name==version'"):
        read_constraints(path)
    path.write_text("onnx==1.2.3\nOnnx_Runtime==1.0\n")
    assert read_constraints(path) == {"onnx": "1.2.3", "onnx-runtime": "1.0"}


def test_differences_warn_for_runtimes_and_note_the_rest() -> None:
    numpy_now = metadata.version("numpy")
    pins = {"numpy": "0.0.1", "pyyaml": "0.0.1", "openvino": "not-installed-here", "torch": "9.9",
            "onnx": metadata.version("onnx")}
    found = {name: (level, installed) for level, name, installed, _ in version_differences(pins)}
    assert found["numpy"] == ("warning", numpy_now)
    assert found["pyyaml"][0] == "note"
    assert "onnx" not in found  # the tested version is installed
    lines = difference_lines(pins)
    assert f"warning: numpy {numpy_now} is installed; qdeploy was tested with 0.0.1" in lines
    assert any("pip install -c constraints.txt" in line for line in lines)
    assert difference_lines({"onnx": metadata.version("onnx")}) == []


def test_a_missing_optional_runtime_is_no_warning(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tested_versions, "installed_version", lambda name: None)
    found = {name for _, name, _, _ in version_differences({"torch": "2.13.0", "onnxruntime": "1.0"})}
    assert found == {"onnxruntime"}


def test_doctor_warns_when_installed_versions_differ(tmp_path: Path) -> None:
    """The installed onnxruntime made to differ from the tested list: doctor's text and JSON say so."""
    shim = tmp_path / "sitecustomize.py"
    shim.write_text("import qdeploy.pipeline.results.tested_versions as t\n"
                    "t.TESTED = {**t.TESTED, 'onnxruntime': '0.0.1'}\n")
    env = {"PYTHONPATH": f"{tmp_path}:{REPO}", "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-m", "qdeploy.cli", "doctor"], capture_output=True, text=True,
                          env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    installed = metadata.version("onnxruntime")
    assert f"warning: onnxruntime {installed} is installed; qdeploy was tested with 0.0.1" in done.stdout
    as_json = subprocess.run([sys.executable, "-m", "qdeploy.cli", "doctor", "--json"], capture_output=True,
                             text=True, env=env, timeout=120)
    record = json.loads(as_json.stdout)["tested_versions"]
    assert record["runtimes"]["onnxruntime"] == {"tested": "0.0.1", "installed": installed}
    # only the changed pin is asserted: other libraries may differ from constraints.txt on this machine
    assert record["match"] is False
    assert record["differ"]["onnxruntime"] == {"installed": installed, "tested": "0.0.1"}


def test_the_report_environment_says_whether_runtimes_are_the_tested_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    from qdeploy.pipeline.results.envinfo import environment

    monkeypatch.setattr(tested_versions, "TESTED", {**TESTED, "numpy": "0.0.1"})
    recorded = environment.__wrapped__()["tested_versions"]
    assert recorded["match"] is False
    assert recorded["differ"]["numpy"] == {"installed": metadata.version("numpy"), "tested": "0.0.1"}

