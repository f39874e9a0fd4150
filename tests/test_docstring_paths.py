"""Docstrings name files that exist: a module moved or renamed must not leave its old path in prose (issue 30)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from tests.helpers.models import REPO

SOURCE_PACKAGES = ("qdeploy", "pipeline", "stages", "calibration")
# a path with at least one folder, ending .py or .md; "path/to/..." is the conventional placeholder
PATH_IN_PROSE = re.compile(r"(?<![\w/.<-])((?:[\w.-]+/)+[\w.-]+\.(?:py|md))\b")
PLACEHOLDERS = ("path/to/",)


def _docstrings(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(), filename=str(path))
    nodes = [tree, *(node for node in ast.walk(tree)
                     if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef))]
    return [(getattr(node, "lineno", 1), doc) for node in nodes if (doc := ast.get_docstring(node))]


def _exists(reference: str) -> bool:
    # installed, pipeline/ and stages/ live under qdeploy/; in the checkout they sit at the top level
    candidates = [REPO / reference]
    if reference.startswith("qdeploy/"):
        candidates.append(REPO / reference.removeprefix("qdeploy/"))
    return any(candidate.exists() for candidate in candidates)


def test_every_path_a_docstring_names_exists() -> None:
    missing = []
    for package in SOURCE_PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            for line, doc in _docstrings(path):
                for reference in PATH_IN_PROSE.findall(doc):
                    if not reference.startswith(PLACEHOLDERS) and not _exists(reference):
                        missing.append(f"{path.relative_to(REPO)}:{line}: {reference}")
    assert not missing, "docstrings name files that do not exist:\n" + "\n".join(missing)


def test_the_check_catches_a_stale_path(tmp_path: Path) -> None:
    source = tmp_path / "m.py"
    source.write_text('"""Runs beside stages/quantize_budget.py and docs/benchmarks.md."""\n')
    references = [ref for _, doc in _docstrings(source) for ref in PATH_IN_PROSE.findall(doc)]
    assert references == ["stages/quantize_budget.py", "docs/benchmarks.md"]
    assert [_exists(ref) for ref in references] == [False, True]
