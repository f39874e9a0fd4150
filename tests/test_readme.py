"""The recipe reference is generated from the models, the README stays short, and its commands match CI."""

from __future__ import annotations

import re

import pytest

from qdeploy.pipeline.recipe.docs import PAGES, markers, reference
from tests.helpers.models import REPO


@pytest.mark.parametrize("part", sorted(PAGES))
def test_the_reference_pages_match_the_models(part: str) -> None:
    page = (REPO / PAGES[part]).read_text()
    begin, end = markers(part)
    start = page.index(begin) + len(begin) + 1
    assert page[start:page.index(end)] == reference(part), \
        f"run `python -m qdeploy.pipeline.recipe.docs {PAGES[part]}`"


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
