"""The wheel installs one package, qdeploy, holding every module of the repository's folders."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.helpers.imports import modules
from tests.helpers.models import REPO


def test_pyproject_lists_every_package_folder() -> None:
    """setuptools installs only the packages pyproject.toml lists: a new folder left out of the list works in an
    editable install (and in every test) but is missing from the wheel.  The slow test below builds the wheel."""
    tomllib = pytest.importorskip("tomllib")  # the standard library's from Python 3.11
    listed = set(tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    folders = {name for name, path in modules().items() if path.name == "__init__.py"}
    assert listed == folders


@pytest.mark.slow
def test_the_wheel_has_one_top_level_package_with_every_module(tmp_path: Path) -> None:
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                            "-w", str(tmp_path), str(REPO)], capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, built.stderr
    wheel = next(tmp_path.glob("qdeploy-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    top = {name.split("/", 1)[0] for name in names if not name.split("/", 1)[0].endswith(".dist-info")}
    assert top == {"qdeploy"}
    expected = {path.relative_to(REPO).parts for path in modules().values()}
    shipped = {tuple(name.split("/")[1:]) for name in names if name.endswith(".py")}
    # qdeploy/<x> ships as is; pipeline/, stages/, calibration/ ship as qdeploy/pipeline/... (package-dir)
    expected = {parts[1:] if parts[0] == "qdeploy" else parts for parts in expected}
    assert expected == shipped
