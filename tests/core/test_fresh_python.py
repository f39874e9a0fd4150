"""A function called in a fresh interpreter: its result, its failure said, and a caller's script without a main
guard is not run again (multiprocessing's spawn would re-import it)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from qdeploy.core.fresh_python import FreshPythonError, call_in_fresh_python
from tests.helpers.models import REPO


def test_the_result_comes_back_from_an_interpreter_of_its_own() -> None:
    import numpy  # noqa: F401  loaded here: the child starts without it

    assert call_in_fresh_python("tests.helpers.fresh", "echo", {"a": [1, 2]}) == {"got": {"a": [1, 2]},
                                                                                 "numpy_loaded": False}


def test_a_failure_in_the_child_is_said_with_its_message() -> None:
    with pytest.raises(FreshPythonError, match=r"(?s)exit status 1: .*ValueError: asked to fail: on purpose"):
        call_in_fresh_python("tests.helpers.fresh", "crash", {"why": "on purpose"})


def test_a_script_without_a_main_guard_runs_once(tmp_path: Path) -> None:
    """What a user writes: the call at the top level of a script."""
    script = tmp_path / "user_script.py"
    marker = tmp_path / "runs.txt"
    script.write_text(textwrap.dedent(f"""
        from pathlib import Path
        from qdeploy.core.fresh_python import call_in_fresh_python
        with open({str(marker)!r}, "a") as runs:
            runs.write("run\\n")
        print(call_in_fresh_python("tests.helpers.fresh", "echo", {{"x": 1}})["got"])
    """))
    done = subprocess.run([sys.executable, str(script)], cwd=REPO, capture_output=True, text=True, timeout=120,
                          check=True)
    assert done.stdout.strip() == "{'x': 1}" and marker.read_text() == "run\n"
