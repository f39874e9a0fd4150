"""The import graph of qdeploy: layers point one way and no file imports itself back.

Every import counts: top-level, inside functions and under TYPE_CHECKING alike (an import moved into a
function to dodge a circle is still a circle).  The layers, from the bottom, are those of docs/design.md.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.helpers.imports import ROOT, cycles, graph, layer_of, modules, private_owner, whole_graph


def test_no_import_circles_between_files() -> None:
    assert cycles(graph()) == []


def test_no_import_circles_with_the_benchmarks_either() -> None:
    """benchmarks/ scripts share code through modules of their own, never by importing each other back."""
    assert cycles(whole_graph()) == []


def test_the_package_never_imports_benchmarks() -> None:
    edges = whole_graph()
    upward = [f"{source} imports {target}" for source in modules() for target in sorted(edges[source])
              if target.startswith("benchmarks.")]
    assert upward == []


def test_private_modules_stay_inside_their_package() -> None:
    """A private module (``_x``) is imported only from its own package, or, for a stage's internals, from that
    stage: another package asks for what it needs through a public module."""
    reach_ins = [f"{source} imports {target}" for source, targets in graph().items() for target in sorted(targets)
                 if (owner := private_owner(target)) and not (source == owner or source.startswith(owner + "."))]
    assert reach_ins == []


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
    assert private_owner("qdeploy.stages.quantize.ptq._prepare") == "qdeploy.stages.quantize"
    assert private_owner("qdeploy.cli._common") == "qdeploy.cli"
    assert private_owner("qdeploy.stages.quantize.config") is None
    assert layer_of("qdeploy.pipeline.report.html") == 4 and layer_of("qdeploy.pipeline.run.runner") == 5
    assert layer_of("qdeploy.core.errors") < layer_of("qdeploy.stages.fp16._graph") < layer_of("qdeploy.cli")


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


def test_own_imports_sit_at_the_top_of_their_file() -> None:
    """A file's header says what it depends on: an import of qdeploy's own modules inside a function needs a
    reason in a comment on its line or just above its group of imports, ``# cycle: ...`` or ``# lazy: ...``."""
    unexplained = []
    for path in modules().values():
        lines = path.read_text().splitlines()
        tree = ast.parse("\n".join(lines))
        imports = [node for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))]
        import_lines = {line for node in imports for line in range(node.lineno, node.end_lineno + 1)}
        for function in ast.walk(tree):
            if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(function):
                if _imports_own_module(node) and not _has_reason(lines, node, import_lines):
                    unexplained.append(f"{path.relative_to(ROOT)}:{node.lineno} {ast.unparse(node)}")
    assert sorted(set(unexplained)) == []


def _imports_own_module(node: ast.AST) -> bool:
    if isinstance(node, ast.ImportFrom):
        return node.level > 0 or (node.module or "").split(".")[0] == "qdeploy"
    return isinstance(node, ast.Import) and any(alias.name.split(".")[0] == "qdeploy" for alias in node.names)


def _has_reason(lines: list[str], node: ast.stmt, import_lines: set[int]) -> bool:
    """A ``# cycle:``/``# lazy:`` comment on the import's lines or on the line above its run of imports."""
    above = node.lineno - 1
    while above in import_lines:
        above -= 1
    said = lines[above - 1:node.end_lineno] if above >= 1 else lines[:node.end_lineno]
    return any("# cycle:" in line or "# lazy:" in line for line in said)


def test_scripts_import_the_package_by_its_installed_name() -> None:
    """benchmarks/, tests/ and tools/ import ``qdeploy.calibration``, never the folder ``calibration`` (nor
    ``pipeline``, ``stages``): with the repository on sys.path that would load a second copy of the module."""
    folders = ("calibration", "pipeline", "stages")
    offenders = []
    for top in ("benchmarks", "tests", "tools"):
        for path in (ROOT / top).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                names = ([node.module or ""] if isinstance(node, ast.ImportFrom) and node.level == 0
                         else [alias.name for alias in node.names] if isinstance(node, ast.Import) else [])
                offenders += [f"{path.relative_to(ROOT)}:{node.lineno} imports {name}" for name in names
                              if name.split(".")[0] in folders]
    assert offenders == []


MAX_FILE_LINES = 500
SOURCE_SUFFIXES = (".py", ".md", ".yaml", ".yml", ".toml", ".sh")


def test_no_source_file_is_over_500_lines() -> None:
    """The brief's bound, kept by a test: two modules had crept to 502 and 508 lines unnoticed."""
    import os

    root = Path(__file__).resolve().parent.parent
    long = {}
    for folder, subfolders, files in os.walk(root):
        subfolders[:] = [name for name in subfolders if not name.startswith(".") and name not in ("runs", "build")]
        for name in files:
            if name.endswith(SOURCE_SUFFIXES):
                path = Path(folder) / name
                lines = path.read_text(errors="replace").count("\n")
                if lines > MAX_FILE_LINES:
                    long[str(path.relative_to(root))] = lines
    assert not long, f"files over {MAX_FILE_LINES} lines (split them): {long}"
