"""The docs show what a current run prints, and read as user pages.

Marks in the pages (Markdown comments, invisible when rendered), each on the line before a fenced block:

- ``<!-- example: NAME -->``: what a command prints; a slow test regenerates it from a current run and compares.
- ``<!-- file: PATH -->``: the tutorial (docs/your-model.md) writes the block to PATH.  Its ``python`` blocks run in
  order, each as a script in one folder, as a reader would run them.

Regenerate every example after a change of wording: ``python -m tests.test_docs_examples --write`` (runs the demo and
the tutorial, then rewrites each marked block with what the run printed).

What is compared.  Timing and the CPU decide part of a run's text, so each example is reduced before it is compared:
numbers are masked everywhere; a table is compared by its header and by each row's variant, target and status (the
``fp32@default`` row exists only on CPUs whose OpenVINO runs float32 below float32 by default, and is left out); the
verdict's detail lines ("not fp16: slower ...") and the "noisy" note are left out.  A ship line is compared by its
target, the variant it ships (one the run built for that target: which one is fastest can differ between CPUs), and
its package, which must be ``packages/<the folder name the code gives that target and variant> (checked)``; its
reason is compared word for word (numbers masked) where the run made the same decision (same pick, runner-up and
busy-machine state).  So a renamed package folder, a reworded ship line or a variant a run no longer builds fails.

The fast tests here hold the pages to what the docs promise their readers: user pages under 20 KB, no development
log in them (issue numbers, commits, "this machine", scratch paths: those belong in dated records under
docs/measurements/, which say when, where and how they were measured), every page listed in docs/index.md, and
links that resolve.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.docs_runs import (
    DEMO,
    FENCE,
    HEADLINE,
    TUTORIAL,
    Marked,
    Run,
    current_run,
    marked,
    run_demo,
    run_tutorial,
)
from tests.helpers.models import REPO

DOCS = REPO / "docs"
MEASUREMENTS = DOCS / "measurements"
INDEX = DOCS / "index.md"
MAX_PAGE_BYTES = 20_000

NUMBER = re.compile(r"\d+(?:[.,]\d+)*(?:e[+-]?\d+)?")


def user_pages() -> list[Path]:
    """README and every docs page but the dated measurement records."""
    pages = [REPO / "README.md", *sorted(DOCS.rglob("*.md"))]
    return [page for page in pages if MEASUREMENTS not in page.parents]


def records() -> list[Path]:
    return sorted(MEASUREMENTS.glob("*.md"))


def _name(page: Path) -> str:
    return str(page.relative_to(REPO))


# ---------------------------------------------------------------------------------------------------------------
# user pages: size, no development log, listed, links resolve


@pytest.mark.parametrize("page", user_pages(), ids=_name)  # the generated reference pages too
def test_a_user_page_is_under_20_kb(page: Path) -> None:
    size = len(page.read_bytes())
    assert size < MAX_PAGE_BYTES, \
        f"{_name(page)} is {size:,} bytes: split it, or move measurements to docs/measurements/"


def _prose(text: str) -> str:
    """The text without fenced blocks and inline code: what the page says in its own words."""
    return re.sub(r"`[^`\n]+`", "", FENCE.sub("", text))


LOG = [  # (pattern, what it is), searched in a page's prose
    (re.compile(r"\b(?:issue|issues|PR)\s+#?\d+", re.IGNORECASE), "an issue number"),
    (re.compile(r"\bcommit\s+[0-9a-f]{7,40}\b|\b(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{7,12}\b"), "a commit"),
    (re.compile(r"\bthis (?:development )?machine\b", re.IGNORECASE), "'this machine'"),
    (re.compile(r"/tmp/"), "a scratch path"),
    (re.compile(r"\bbug fixed on the way\b|\bused to\b", re.IGNORECASE), "history"),
]


@pytest.mark.parametrize("page", user_pages(), ids=_name)
def test_a_user_page_is_not_a_development_log(page: Path) -> None:
    prose = _prose(page.read_text())
    found = [f"{what}: '{match.group(0)}'" for pattern, what in LOG for match in pattern.finditer(prose)]
    assert not found, f"{_name(page)} holds " + "; ".join(found) + " (dated records go under docs/measurements/)"


CODE_PATH = re.compile(r"(?<![\w/.<-])((?:qdeploy|pipeline|stages|calibration|tests|benchmarks|tools|recipes)/"
                       r"(?:[\w.@-]+/)*[\w.@-]+\.(?:py|yaml|json|sh))\b")


@pytest.mark.parametrize("page", user_pages(), ids=_name)
def test_the_files_a_user_page_names_exist(page: Path) -> None:
    """A module moved or renamed must not leave its old path in a page (records keep theirs: they are history)."""
    missing = sorted({path for path in CODE_PATH.findall(page.read_text())
                      if not (REPO / path).exists() and not (REPO / path.removeprefix("qdeploy/")).exists()})
    assert not missing, f"{_name(page)} names files that do not exist: {missing}"


@pytest.mark.parametrize("record", records(), ids=_name)
def test_a_measurement_record_says_when_where_and_how(record: Path) -> None:
    assert re.fullmatch(r"\d{4}-\d{2}-\d{2}-[a-z0-9-]+\.md", record.name), f"{record.name}: name it YYYY-MM-DD-topic.md"
    text = record.read_text()
    for key in ("Date", "Commit", "Machine", "Command"):
        assert f"**{key}:**" in text, f"{_name(record)} does not say its {key.lower()}"


def test_every_docs_page_is_listed_in_the_index() -> None:
    listed = {(INDEX.parent / link).resolve() for link in re.findall(r"\]\(([^)#\s]+\.md)", INDEX.read_text())}
    missing = [_name(page) for page in sorted(DOCS.rglob("*.md")) if page != INDEX and page.resolve() not in listed]
    assert not missing, f"docs/index.md does not list {missing}"


def _anchors(page: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens, repeats numbered."""
    seen: dict[str, int] = {}
    anchors = set()
    for heading in re.findall(r"^#{1,6} (.+)$", FENCE.sub("", page.read_text()), re.MULTILINE):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        anchors.add(slug if slug not in seen else f"{slug}-{seen[slug]}")
        seen[slug] = seen.get(slug, 0) + 1
    return anchors


@pytest.mark.parametrize("page", [REPO / "README.md", *sorted(DOCS.rglob("*.md"))], ids=_name)
def test_links_between_pages_resolve(page: Path) -> None:
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", FENCE.sub("", page.read_text())):
        if re.match(r"[a-z]+:", target):
            continue  # a web address
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        if not linked.exists():
            broken.append(f"{target} (no such file)")
        elif anchor and linked.suffix == ".md" and anchor not in _anchors(linked):
            broken.append(f"{target} (no heading '#{anchor}' in {linked.name})")
    assert not broken, f"{_name(page)}: " + "; ".join(broken)


PACKAGE_FOLDER = re.compile(r"(?<![\w-])(ort|openvino)-(cpu|gpu|npu|cuda|tensorrt|openvino)-([\w.]+(?:@\w+)?)"
                            r"(?![\w@-])")


def test_the_package_folders_a_page_names_are_named_as_a_run_names_them() -> None:
    """`ort-cpu-int8@ort`, not `ort-cpu-int8`: each folder a page names is the code's name for a variant the demo
    recipe builds for that target (the demo's variants, split per runtime; `fp32@default` on OpenVINO)."""
    from qdeploy.core.runtimes import built_for
    from qdeploy.pipeline.publish.package import package_name
    from qdeploy.pipeline.recipe.loader import load_recipe_file
    from qdeploy.pipeline.run.plan import build_plan

    variants = [*build_plan(load_recipe_file(DEMO)).variants, "fp32@default"]
    wrong = []
    for page in user_pages():
        for match in PACKAGE_FOLDER.finditer(page.read_text()):
            target, variant = f"{match.group(1)}:{match.group(2)}", match.group(3)
            if variant not in variants or not built_for(variant, target) or \
                    package_name(target, variant) != match.group(0):
                wrong.append(f"{_name(page)}: {match.group(0)}")
    assert not wrong, f"package folders no run writes: {sorted(set(wrong))}"


# ---------------------------------------------------------------------------------------------------------------
# marked examples


def all_marked() -> list[Marked]:
    return [mark for page in user_pages() for mark in marked(page)]


def test_every_example_mark_precedes_a_block_and_names_an_example_the_test_regenerates() -> None:
    for page in user_pages():
        text = page.read_text()
        marks = re.findall(r"^<!-- (?:example|file): ", text, re.MULTILINE)
        assert len(marks) == len(marked(page)), f"{_name(page)}: a mark not directly before a fenced block"
    names = [mark.name for mark in all_marked() if mark.kind == "example"]
    assert names, "the docs mark no example"
    unknown = sorted(set(names) - set(SOURCES))
    assert not unknown, f"no source for the examples {unknown}: add them to SOURCES"
    files = [mark for mark in all_marked() if mark.kind == "file"]
    assert all(mark.page == TUTORIAL for mark in files), "file marks belong to the tutorial"


# --- what the runs print --------------------------------------------------------------------------------------


SOURCES: dict[str, Callable[[Path], Run]] = {
    name: run_demo for name in ("demo-check", "demo-run", "demo-ship", "demo-packages", "demo-package-files",
                                "demo-check-py", "demo-snippet", "demo-explain")
} | {name: run_tutorial for name in ("your-model-inputs", "your-model-check", "your-model-run")}


# --- reducing an example to what a run on any CPU repeats ------------------------------------------------------


def mask(text: str) -> str:
    """Numbers as N, and runs of spaces as one: a column padded to a wider number is the same line.

    A share printed as ``<1%`` (under half a percent on a fast CPU) is the same line as ``3%``.
    """
    return re.sub(r" {2,}", " ", NUMBER.sub("N", text).replace("<N%", "N%"))


def _top_level(text: str, separator: str) -> list[str]:
    """``text`` split at ``separator`` outside brackets."""
    parts, depth, current = [], 0, ""
    for char in text:
        depth += {"(": 1, ")": -1}.get(char, 0)
        if char == separator and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    return [*parts, current]


@dataclass
class Ship:
    target: str
    variant: str
    undecided: bool
    why: str
    package: str
    runner_up: str | None = None

    @classmethod
    def parse(cls, line: str) -> Ship:
        match = HEADLINE.match(line)
        assert match is not None
        parts = [part.strip() for part in _top_level(match.group("rest"), ";")]
        package = parts[-1] if parts[-1].startswith(("package ", "no package")) else ""
        why = "; ".join(parts[1:-1] if package else parts[1:])
        return cls(match.group("target"), match.group("variant"), bool(match.group("undecided")), mask(why), package)


def reduce(text: str) -> list[Any]:
    """What an example says that any run of it repeats (see the module's docstring)."""
    items: list[Any] = []
    table = ""  # the table the lines are rows of: "variant" (variant x target) or "#" (explain's layers)
    for line in text.replace("**", "").splitlines():
        stripped = line.strip().removeprefix("- ") if line.startswith("- ") else line.strip()
        if not stripped:
            table = ""
            continue
        if set(stripped) <= set("─- "):
            continue
        cells = re.split(r"\s{2,}", stripped)
        if cells[0] in ("variant", "#"):
            table = cells[0]
            items.append(("header", tuple(cells)))
            continue
        if table == "variant":  # a row: which pair, and its status; @default rows only on some CPUs
            if not cells[0].endswith("@default"):
                items.append(("row", cells[0], cells[1], cells[-1]))
            continue
        if table == "#":  # a layer: which ones rank first is the timing's
            continue
        if stripped.startswith("* noisy"):
            continue
        if HEADLINE.match(stripped):
            items.append(Ship.parse(stripped))
        elif line.startswith("  ") and items and isinstance(items[-1], Ship):  # a verdict's detail line
            runner = re.match(r"(?:- )?runner-up (\S+)", stripped)
            if runner:
                items[-1].runner_up = runner.group(1)
        else:
            items.append(("line", mask(stripped)))
    return items


def differences(name: str, shown: str, printed: str, run: Run) -> list[str]:
    """Where an example the docs show differs from what the run printed, once both are reduced."""
    from qdeploy.pipeline.publish.package import package_name

    built = {(row["target"], row["variant"]) for row in run.report()["validation"]}
    folders = {package_name(target, variant): target for target, variant in built}
    if name == "demo-packages":
        # which target each folder serves (the pick can differ between CPUs), each named as the code names it
        unknown = [name for name in shown.split() if name not in folders and "." not in name]
        if unknown:
            return [f"{unknown} are not package folders a current run writes (those are {sorted(folders)})"]
        if sorted(folders.get(name, name) for name in shown.split()) != \
                sorted(folders.get(name, name) for name in printed.split()):
            return [f"the listing shows {shown.split()}, the run wrote {printed.split()}"]
        return []
    doc, now = reduce(shown), reduce(printed)
    problems = []
    if len(doc) != len(now):
        problems.append(f"{len(doc)} lines to compare in the docs, {len(now)} in the run")
    for said, ran in zip(doc, now, strict=False):
        if isinstance(said, Ship) and isinstance(ran, Ship):
            problems += _ship_differences(said, ran, built)
        elif said != ran:
            problems.append(f"docs: {said}\n      run:  {ran}")
    return problems


def _ship_differences(said: Ship, ran: Ship, built: set[tuple[str, str]]) -> list[str]:
    from qdeploy.pipeline.publish.package import package_name

    problems = []
    if said.target != ran.target:
        return [f"a ship line for {said.target} where the run has {ran.target}"]
    if (said.target, said.variant) not in built:
        problems.append(f"{said.target}: ships '{said.variant}', a variant the run did not build for it "
                        f"({sorted(variant for target, variant in built if target == said.target)})")
    want = f"package packages/{package_name(said.target, said.variant)} (checked)"
    if said.package != want:
        problems.append(f"{said.target}: '{said.package}' where a run writes '{want}'")
    if ran.package != f"package packages/{package_name(ran.target, ran.variant)} (checked)":
        problems.append(f"{ran.target}: the run says '{ran.package}'")
    same_decision = (said.variant, said.runner_up, said.undecided) == (ran.variant, ran.runner_up, ran.undecided)
    if same_decision and not _same_reason(said.why, ran.why):
        problems.append(f"{said.target}: the reason reads\n      docs: {said.why}\n      run:  {ran.why}")
    return problems


_TIED = re.compile(r"(?:ties with (\S+) within the benchmark's noise|; (\S+) is within the benchmark's noise)")


def _same_reason(said: str, ran: str) -> bool:
    """The same words, or the same tie said the other way round: whether the pick's median came out just below or
    just above the artifact it ties with is noise, and the verdict words the two cases differently ("fastest ...;
    X is within the benchmark's noise" or "ties with X within the benchmark's noise"); the tie, its partner and
    the rule that broke it must agree."""
    if said == ran:
        return True
    tied = [_TIED.search(why) for why in (said, ran)]
    if not all(tied):
        return False
    partners = [next(group for group in found.groups() if group) for found in tied if found]
    rules = [why.rsplit("(ties go to", 1)[-1] for why in (said, ran)]
    return partners[0] == partners[1] and rules[0] == rules[1] and "(ties go to" in said


# --- the slow tests: a current run against every example ------------------------------------------------------



def _examples(source: Callable[[Path], Run]) -> list[Marked]:
    return [mark for mark in all_marked() if mark.kind == "example" and SOURCES.get(mark.name) is source]


@pytest.mark.slow
@pytest.mark.parametrize("source", [run_demo, run_tutorial], ids=lambda source: source.__name__)
def test_the_examples_the_docs_show_are_what_a_current_run_prints(source: Callable[[Path], Run]) -> None:
    run = current_run(source)
    problems = []
    for mark in _examples(source):
        found = differences(mark.name, mark.body, run.printed[mark.name], run)
        if found:
            problems.append(f"{_name(mark.page)} example {mark.name}:\n  " + "\n  ".join(found))
    assert not problems, \
        "\n".join(problems) + "\n(after a deliberate change: python -m tests.test_docs_examples --write)"


def write_examples() -> list[str]:
    """Rewrite every marked example with what a current run prints; the pages changed."""
    changed = []
    for page in user_pages():
        text = page.read_text()
        for mark in reversed(marked(page)):
            if mark.kind != "example":
                continue
            printed = current_run(SOURCES[mark.name]).printed[mark.name] + "\n"
            text = text[:mark.start] + printed + text[mark.start + len(mark.body):]
        if text != page.read_text():
            page.write_text(text)
            changed.append(_name(page))
    return changed


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit("usage: python -m tests.test_docs_examples --write")
    print("\n".join(write_examples()) or "no example changed")


def test_a_tie_said_either_way_round_is_the_same_reason_and_another_partner_is_not() -> None:
    rule = "(ties go to fidelity: report.tie_break)"
    fastest = f"fastest artifact that passed (N ms); fpN is within the benchmark's noise (N ms), and fpN is {rule}"
    tied = f"ties with fpN within the benchmark's noise (N ms against N ms) and is the reference itself {rule}"
    assert _same_reason(fastest, tied)
    assert not _same_reason(fastest, tied.replace("ties with fpN", "ties with intN"))
    assert not _same_reason(fastest, tied.replace("fidelity", "size"))
    assert not _same_reason("fastest artifact that passed (N ms)", "fastest artifact that passed (N ms), smaller")


def test_a_share_under_one_percent_masks_as_any_share_and_other_text_does_not() -> None:
    line = "q/dq kernels: {} of MACs, {} of time on ort:cpu"
    assert mask(line.format("4%", "<1%")) == mask(line.format("4%", "3%"))
    assert mask(line.format("4%", "n/a")) != mask(line.format("4%", "3%"))
