"""tests/ mirrors the package tree: each package of qdeploy has its tests folder, and a test file sits with the
package it tests.

The packages are qdeploy's folders with an ``__init__.py``; ``qdeploy.a.b`` is tested in ``tests/a/b``
(``qdeploy`` itself, its API, at the top of tests/, with the tests of the whole).  tests/robustness is
cross-cutting (bad input through every command) and tests/helpers holds shared builders.
"""

from __future__ import annotations

from pathlib import Path

from tests.helpers.imports import ROOT, imports_of, modules

TESTS = ROOT / "tests"
CROSS_CUTTING = {TESTS / "robustness"}
# A recipe run through the runner tests whichever stage its recipe names: a test that imports only the pipeline
# may sit with that stage (and the API, the root package, with anything).
DRIVERS = {"qdeploy", "qdeploy.pipeline", "qdeploy.pipeline.recipe", "qdeploy.pipeline.run"}


def packages() -> list[str]:
    return sorted(name for name, path in modules().items() if path.name == "__init__.py")


def folder_of(package: str) -> Path:
    return TESTS.joinpath(*package.split(".")[1:])


def package_of(module: str, known: list[str]) -> str:
    """The innermost package that holds a module."""
    return max((p for p in known if module == p or module.startswith(p + ".")), key=len)


def related(folder_package: str, imported: str) -> bool:
    """The imported package is the folder's, one inside it, or one that holds it (but the root, which holds all)."""
    return (imported == folder_package or imported.startswith(folder_package + ".")
            or (imported != "qdeploy" and folder_package.startswith(imported + ".")))


def misplaced(path: Path, folder_package: str, imported: set[str]) -> str | None:
    """Why a test file does not belong in its package's folder, or None."""
    if not imported:
        return None  # black-box tests (the CLI in a subprocess) are placed by what they run
    if not imported <= DRIVERS and not any(related(folder_package, package) for package in imported):
        return f"{path.relative_to(TESTS)} imports nothing of {folder_package} (it imports {sorted(imported)})"
    only = next(iter(imported)) if len(imported) == 1 else None
    if only and only not in DRIVERS and not (folder_package == only or folder_package.startswith(only + ".")):
        return f"{path.relative_to(TESTS)} imports only {only}: move it to {folder_of(only).relative_to(ROOT)}"
    return None


def holds_code(package: str) -> bool:
    """A package with modules of its own; one that only groups subpackages is tested through them."""
    path = modules()[package]
    return any(child.name != "__init__.py" for child in path.parent.glob("*.py"))


def test_every_package_has_a_non_empty_folder_of() -> None:
    missing = [f"{package}: {folder_of(package).relative_to(ROOT)}" for package in packages()
               if not (folder_of(package) / "__init__.py").is_file()
               or (holds_code(package) and not any(folder_of(package).glob("test_*.py")))]
    assert missing == []


def test_every_test_file_sits_with_the_package_it_tests() -> None:
    known, found = packages(), modules()
    folders = {folder_of(package): package for package in known}
    wrong = []
    for path in sorted(TESTS.rglob("test_*.py")):
        if any(path.is_relative_to(folder) for folder in CROSS_CUTTING):
            continue
        if path.parent not in folders:
            wrong.append(f"{path.relative_to(TESTS)} sits in no package's tests folder")
            continue
        imported = {package_of(module, known) for module in imports_of(path, set(found))}
        wrong.append(misplaced(path, folders[path.parent], imported))
    assert [reason for reason in wrong if reason] == []


def test_the_placement_check_sees_a_misplaced_file() -> None:
    """The check above would catch a file in the wrong folder (a targets test among the pipeline's)."""
    path = TESTS / "pipeline" / "test_x.py"
    assert misplaced(path, "qdeploy.pipeline", {"qdeploy.targets"}) is not None
    assert misplaced(path, "qdeploy.pipeline", {"qdeploy.targets", "qdeploy.core"}) is not None
    assert misplaced(path, "qdeploy.pipeline", {"qdeploy.pipeline.report"}) is not None
    assert misplaced(path, "qdeploy.pipeline", {"qdeploy.pipeline", "qdeploy.core"}) is None
    assert misplaced(path, "qdeploy.stages.fp16", {"qdeploy.pipeline"}) is None
    assert misplaced(path, "qdeploy.stages.quantize.lower", {"qdeploy.stages.quantize", "qdeploy.core"}) is None
