"""README.md and the docs pages (docs/**/*.md, the dated records of docs/measurements/ aside) say only what the
code accepts: every `qdeploy ...` command line they show (in code blocks and inline code) names a subcommand and
options that `qdeploy <subcommand> --help` lists; every YAML block validates; and the demo recipe they show is
recipes/demo.yaml.

YAML blocks are read as:
- a sweep file (a `sweep` key): validated against the sweep file's schema;
- a whole recipe (`name` and `model`): the demo recipe's name makes it the demo, which must equal
  recipes/demo.yaml as data (comments aside) and passes `qdeploy check`'s validation, files included; a block
  whose first line is a comment with "excerpt" in it may show part of it (each key it has, with the demo's
  value); any other recipe is validated against the schema (its files are examples, not in the repository);
- a fragment (anything else, e.g. a `variants:` or `validate:` section): merged into the demo recipe (mappings
  key by key, other values replaced; the demo's gates left out where the fragment has variants, which may
  redefine the ones they name) and validated against the schema.
Nothing is run: commands get `--help` through typer's CliRunner, in process.
"""

from __future__ import annotations

import copy
import re
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from qdeploy.cli import app
from qdeploy.pipeline.recipe.loader import parse_recipe
from qdeploy.pipeline.recipe.schema import Recipe
from qdeploy.pipeline.sweep import SweepFile
from tests.helpers.imports import modules
from tests.helpers.models import REPO

PAGES = [REPO / "README.md", *(page for page in sorted((REPO / "docs").rglob("*.md"))
                                if "measurements" not in page.relative_to(REPO / "docs").parts)]
"""README and every docs page but the dated measurement records, which keep the commands of their day."""
DEMO = REPO / "recipes" / "demo.yaml"
FENCE = re.compile(r"^```([\w-]*)\n(.*?)^```", re.MULTILINE | re.DOTALL)
INLINE = re.compile(r"(?<!`)`(qdeploy [^`\n]+)`(?!`)")
OPTION = re.compile(r"(?<![\w/.=-])(--?[A-Za-z][\w-]*)")


def _blocks(page: Path) -> list[tuple[str, str, int]]:
    """(language, text, line of the opening fence) of each fenced code block."""
    text = page.read_text()
    return [(match.group(1), match.group(2), text.count("\n", 0, match.start()) + 1) for match in FENCE.finditer(text)]


def _commands() -> list[tuple[str, str]]:
    """(where, command) for each `qdeploy ...` segment of a shell line or inline code, comments cut."""
    found = []
    for page in PAGES:
        name = page.relative_to(REPO)
        lines = [(f"{name}:{start + offset + 1}", line) for language, body, start in _blocks(page)
                 if language not in ("yaml", "yml", "python", "json") for offset, line in enumerate(body.splitlines())]
        lines += [(f"{name} (inline)", match.group(1)) for match in INLINE.finditer(page.read_text())]
        for where, line in lines:
            for segment in re.split(r"&&|\|\|", re.split(r"\s#\s", line)[0]):
                segment = segment.strip().removeprefix("$ ")
                words = segment.split()
                if len(words) >= 2 and words[0] == "qdeploy" and re.fullmatch(r"[a-z][a-z-]*|-.*", words[1]):
                    found.append((where, segment))
    return found


@cache
def _help(subcommand: str | None) -> str:
    result = CliRunner().invoke(app, [subcommand, "--help"] if subcommand else ["--help"])
    assert result.exit_code == 0, f"qdeploy {subcommand} --help: {result.output}"
    return result.output


def test_the_docs_show_commands_to_check() -> None:
    commands = {segment.split()[1] for _, segment in _commands()}
    assert {"run", "check", "compare", "package", "sweep", "doctor"} <= commands


@pytest.mark.parametrize(("where", "command"), _commands(), ids=lambda value: value[:60])
def test_every_command_line_names_options_its_help_lists(where: str, command: str) -> None:
    words = command.split()
    subcommand = None if words[1].startswith("-") else words[1]
    text = _help(subcommand)
    for option in OPTION.findall(" ".join(words[1 if subcommand is None else 2:])):
        assert re.search(rf"(?<![\w-]){re.escape(option)}(?![\w-])", text), \
            f"{where}: `{command}` names {option}, which `qdeploy {subcommand or ''} --help` does not list"


@pytest.mark.parametrize(("where", "command"), _commands(), ids=lambda value: value[:60])
def test_a_repeatable_option_is_shown_repeated(where: str, command: str) -> None:
    """`--variant NAME ...` reads as one flag taking several names; click takes one name per flag."""
    assert not re.search(r"(?<![\w-])--?[A-Za-z][\w-]*[ =][^\s\]]+ \.\.\.", command), \
        f"{where}: `{command}`: write a repeatable option as [--option VALUE]..."


def _yaml_blocks() -> list[tuple[str, str]]:
    return [(f"{page.relative_to(REPO)}:{line}", body) for page in PAGES
            for language, body, line in _blocks(page) if language in ("yaml", "yml")]


def _demo() -> dict[str, Any]:
    return yaml.safe_load(DEMO.read_text())


def _merged(base: dict[str, Any], part: dict[str, Any]) -> dict[str, Any]:
    merged = copy.deepcopy(base)
    for key, value in part.items():
        merged[key] = _merged(merged[key], value) if isinstance(value, dict) and isinstance(merged.get(key), dict) \
            else value
    return merged


def _is_excerpt(body: str) -> bool:
    first = body.lstrip().splitlines()[0]
    return first.startswith("#") and "excerpt" in first.lower()


def _within(part: Any, whole: Any) -> bool:
    """Each key of ``part`` is in ``whole`` with a value within it; lists and values equal."""
    if isinstance(part, dict):
        return isinstance(whole, dict) and all(key in whole and _within(value, whole[key])
                                               for key, value in part.items())
    return part == whole


@pytest.mark.parametrize(("where", "body"), _yaml_blocks(), ids=lambda value: value[:40])
def test_every_yaml_block_validates(where: str, body: str) -> None:
    data = yaml.safe_load(body)
    assert isinstance(data, dict), f"{where}: not a YAML mapping"
    if "sweep" in data:
        SweepFile.model_validate(data)
    elif {"name", "model"} <= data.keys() and data["name"] == _demo()["name"]:
        if _is_excerpt(body):
            assert _within(data, _demo()), f"{where}: an excerpt that differs from {DEMO.name}"
        else:
            assert data == _demo(), f"{where}: shows the demo recipe, but not as recipes/demo.yaml has it"
            parse_recipe(body, source=DEMO)  # what `qdeploy check recipes/demo.yaml` validates, files included
    elif {"name", "model"} <= data.keys():
        Recipe.model_validate(data)
    else:
        base = _demo()
        if "variants" in data:  # the demo's gates name the demo's variants, which the fragment may redefine
            base.pop("gates", None)
        Recipe.model_validate(_merged(base, data))


def test_the_readme_and_getting_started_show_the_demo_recipe() -> None:
    for page in (REPO / "README.md", REPO / "docs" / "getting-started.md"):
        shown = [body for language, body, _ in _blocks(page) if language == "yaml"
                 and (yaml.safe_load(body) or {}).get("name") == _demo()["name"]]
        assert shown, f"{page.name} shows no demo recipe"


def test_every_docs_page_the_code_names_exists() -> None:
    """Messages and docstrings send users to docs/<page>.md: a moved or misspelled page sends them nowhere (an error
    message named docs/troubleshooting.md, which lives in docs/how-to/)."""
    named = {(path, page) for path in modules().values()
             for page in re.findall(r"docs/[\w/-]+\.md", Path(path).read_text())}
    assert named  # the pattern still finds what the code says
    missing = sorted(f"{Path(path).name}: {page}" for path, page in named if not (REPO / page).is_file())
    assert missing == []
