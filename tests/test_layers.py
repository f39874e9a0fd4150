"""The import graph of qdeploy: layers point one way and no file imports itself back.

Every import counts: top-level, inside functions and under TYPE_CHECKING alike (an import moved into a
function to dodge a circle is still a circle).  The layers, from the bottom, are those of docs/design.md.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.helpers.imports import cycles, graph, layer_of, modules


def test_no_import_circles_between_files() -> None:
    assert cycles(graph()) == []


def test_every_import_points_down_the_layers() -> None:
    against = [f"{source} (layer {layer_of(source)}) imports {target} (layer {layer_of(target)})"
               for source, targets in graph().items() for target in sorted(targets)
               if layer_of(target) > layer_of(source)]
    assert against == []


def test_a_stage_imports_no_other_stage_internals() -> None:
    def stage(module: str) -> str | None:
        parts = module.split(".")
        return parts[2] if len(parts) > 2 and parts[1] == "stages" else None

    reach_ins = [f"{source} imports {target}" for source, targets in graph().items() for target in targets
                 if stage(source) and stage(target) and stage(source) != stage(target)
                 and any(part.startswith("_") for part in target.split(".")[3:])]
    assert reach_ins == []


def test_the_checker_sees_a_circle_and_an_upward_arrow() -> None:
    """The checks above would catch what they look for (in-function imports included)."""
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert layer_of("qdeploy.pipeline.report.html") == 4 and layer_of("qdeploy.pipeline.runner") == 5
    assert layer_of("qdeploy.core.errors") < layer_of("qdeploy.stages.fp16._graph") < layer_of("qdeploy.pipeline.cli")


def test_no_submodule_shadows_a_name_of_its_package() -> None:
    """Importing ``package._x`` binds ``_x`` in the package: a function ``_x`` defined there would be replaced."""
    clashes = []
    for name, path in modules().items():
        if path.name != "__init__.py":
            continue
        children = {child.stem for child in path.parent.glob("*.py")} | {
            child.name for child in path.parent.iterdir() if (child / "__init__.py").is_file()}
        tree = ast.parse(path.read_text())
        defined = {node.name for node in tree.body if isinstance(node, (ast.FunctionDef, ast.ClassDef))}
        defined |= {target.id for node in tree.body if isinstance(node, ast.Assign)
                    for target in node.targets if isinstance(target, ast.Name)}
        clashes += [f"{name}.{child}" for child in sorted(children & defined)]
    assert clashes == []


def test_public_modules_declare_what_they_export() -> None:
    """Private modules start with '_'; every other module says what it exports."""
    missing = []
    for name, path in modules().items():
        last = name.rsplit(".", 1)[-1]
        if (last.startswith("_") and path.name != "__init__.py") or last == "__main__":
            continue
        tree = ast.parse(path.read_text())
        if not any(isinstance(node, (ast.Assign, ast.AnnAssign)) and "__all__" in ast.unparse(node).split("=")[0]
                   for node in tree.body):
            missing.append(name)
    assert missing == []


def test_no_test_file_imports_another() -> None:
    """Shared builders live in tests/helpers (or fixtures), never in a test file another one imports."""
    tests = Path(__file__).resolve().parent
    offenders = []
    for path in tests.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            module = node.module if isinstance(node, ast.ImportFrom) else None
            if module and module.startswith("tests.") and module.rsplit(".", 1)[-1].startswith(("test_", "conftest")):
                offenders.append(f"{path.relative_to(tests)} imports {module}")
    assert offenders == []
