"""The README's recipe reference is generated from the models, and its commands match CI."""

from __future__ import annotations

from pipeline.docs import BEGIN, END, recipe_reference
from tests.conftest import REPO


def test_recipe_reference_matches_the_models() -> None:
    readme = (REPO / "README.md").read_text()
    start = readme.index(BEGIN) + len(BEGIN) + 1
    assert readme[start:readme.index(END)] == recipe_reference(), "run `python -m pipeline.docs` and paste it"


def test_ci_runs_the_readme_test_command() -> None:
    readme = (REPO / "README.md").read_text()
    ci = (REPO / ".ci" / "run").read_text()
    command = next(line.strip() for line in ci.splitlines() if "pytest" in line and not line.startswith("#"))
    assert command in readme
