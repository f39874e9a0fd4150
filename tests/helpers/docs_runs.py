"""The runs behind the docs' examples: the demo as the README runs it and the tutorial as a reader follows it,
in scratch folders, with what their commands print (tests/test_docs_examples.py compares the docs with them)."""

from __future__ import annotations

import atexit
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from tests.helpers.models import REPO

DOCS = REPO / "docs"
DEMO = REPO / "recipes" / "demo.yaml"
TUTORIAL = DOCS / "your-model.md"
MARKED = re.compile(r"^<!-- (example|file): ([\w./@-]+) -->\n```([\w-]*)\n(.*?)^```", re.MULTILINE | re.DOTALL)
FENCE = re.compile(r"^```([\w-]*)\n(.*?)^```", re.MULTILINE | re.DOTALL)
HEADLINE = re.compile(r"^(?P<target>[a-z]+:[a-z]+): (?P<undecided>undecided: .*?; meanwhile )?ship (?P<variant>\S+)"
                      r"(?P<rest>.*)$")


@dataclass
class Marked:
    page: Path
    kind: str  # example | file
    name: str
    language: str
    body: str
    start: int  # offset of the body in the page


def marked(page: Path) -> list[Marked]:
    text = page.read_text()
    return [Marked(page, match.group(1), match.group(2), match.group(3), match.group(4), match.start(4))
            for match in MARKED.finditer(text)]


@dataclass
class Run:
    """One run of a recipe in a scratch folder, with what its commands printed (paths as a user sees them)."""

    folder: Path
    out: Path
    printed: dict[str, str] = field(default_factory=dict)

    def as_a_user_sees_it(self) -> Run:
        """Paths as printed in the folder the commands ran in (the CLI prints the run folder absolute)."""
        self.printed = {name: text.replace(f"{self.folder}{os.sep}", "") for name, text in self.printed.items()}
        return self

    def report(self) -> dict[str, Any]:
        """report.json, once every published file it names has been checked against its hashes."""
        import qdeploy

        return qdeploy.open_run(self.out).report


def _command(args: list[str], cwd: Path) -> str:
    """stdout of a command run as a user runs it (no terminal: the CLI's plain output), trailing blanks cut."""
    done = subprocess.run(args, cwd=cwd, env=dict(os.environ), capture_output=True, text=True, timeout=1200,
                          check=False)
    assert done.returncode in (0, 1) and "internal error" not in done.stderr, \
        f"{' '.join(args)} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    return "\n".join(line.rstrip() for line in done.stdout.strip("\n").splitlines())


def _qdeploy(*args: str, cwd: Path) -> str:
    return _command([sys.executable, "-m", "qdeploy", *args], cwd)


def _ls(folder: Path) -> str:
    return "\n".join(path.name for path in sorted(folder.iterdir()))


def package_folder(run: Run, target: str) -> Path:
    from qdeploy.pipeline.publish.package import package_name

    variant = run.report()["verdict"]["targets"][target]["variant"]
    return run.out / "packages" / package_name(target, variant)


def run_demo(folder: Path) -> Run:
    """`qdeploy run recipes/demo.yaml` as the README says, in a folder of its own (the run lands in runs/demo-cnn),
    then what the docs show of that run."""
    run = Run(folder, folder / "runs" / "demo-cnn")
    printed = run.printed
    printed["demo-check"] = _qdeploy("check", str(DEMO), cwd=folder)
    printed["demo-run"] = _qdeploy("run", str(DEMO), cwd=folder)
    lines = printed["demo-run"].splitlines()
    first = next(i for i, line in enumerate(lines) if HEADLINE.match(line))
    last = next(i for i, line in enumerate(lines) if line.startswith(("PASS ", "FAIL ", "SKIP ", "packages:")))
    printed["demo-ship"] = "\n".join(lines[first:last])
    printed["demo-packages"] = _ls(run.out / "packages")
    ort_package = package_folder(run, "ort:cpu")
    printed["demo-package-files"] = _ls(ort_package)
    printed["demo-check-py"] = _command([sys.executable, "check.py"], ort_package)
    printed["demo-snippet"] = json.loads((ort_package / "manifest.json").read_text())["snippet"].strip("\n")
    printed["demo-explain"] = _qdeploy("explain", "runs/demo-cnn", "--target", "ort:cpu", "--top", "3", cwd=folder)
    return run.as_a_user_sees_it()


def run_tutorial(folder: Path) -> Run:
    """docs/your-model.md as a reader follows it: its files written, its Python blocks run in order, its commands."""
    run = Run(folder, folder / "runs" / "my-classifier")
    text = TUTORIAL.read_text()
    for mark in marked(TUTORIAL):
        if mark.kind == "file":
            (folder / mark.name).write_text(mark.body)
    blocks = [(match.start(), match.group(2)) for match in FENCE.finditer(text) if match.group(1) == "python"]
    outputs: list[tuple[int, str]] = []
    for index, (start, body) in enumerate(blocks):
        script = folder / f"step{index}.py"
        script.write_text(body)
        outputs.append((start, _command([sys.executable, script.name], folder)))
    for mark in marked(TUTORIAL):
        if mark.name == "your-model-inputs":  # what the Python block before it prints
            run.printed[mark.name] = next(out for start, out in reversed(outputs) if start < mark.start)
    run.printed["your-model-check"] = _qdeploy("check", "recipe.yaml", cwd=folder)
    run.printed["your-model-run"] = _qdeploy("run", "recipe.yaml", cwd=folder)
    return run.as_a_user_sees_it()


@cache
def current_run(source: Callable[[Path], Run]) -> Run:
    folder = Path(tempfile.mkdtemp(prefix=f"qdeploy-docs-{source.__name__}-"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    return source(folder)
