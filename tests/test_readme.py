"""The recipe reference is generated from the models, the README stays short, and its commands match CI."""

from __future__ import annotations

import re

from qdeploy.pipeline.recipe.docs import BEGIN, END, recipe_reference
from tests.helpers.models import REPO


def test_recipe_reference_matches_the_models() -> None:
    page = (REPO / "docs" / "recipe-reference.md").read_text()
    start = page.index(BEGIN) + len(BEGIN) + 1
    assert page[start:page.index(END)] == recipe_reference(), \
        "run `python -m qdeploy.pipeline.recipe.docs docs/recipe-reference.md`"


def test_the_readme_is_short_and_its_links_resolve() -> None:
    readme = (REPO / "README.md").read_text()
    assert len(readme.encode()) < 15_000
    for page in sorted(set(re.findall(r"\]\((docs/[^)#]+)", readme))):
        assert (REPO / page).is_file(), page


def test_ci_runs_the_readme_test_command() -> None:
    readme = (REPO / "README.md").read_text()
    ci = (REPO / ".ci" / "run").read_text()
    command = next(line.strip() for line in ci.splitlines() if "pytest" in line and not line.startswith("#"))
    assert command in readme
