"""The import graph of the qdeploy package, read with ast: modules, their imports, layers, circles."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


FOLDERS = {"qdeploy": ROOT / "qdeploy", "qdeploy.pipeline": ROOT / "pipeline", "qdeploy.stages": ROOT / "stages",
           "qdeploy.calibration": ROOT / "calibration"}


LAYERS = (  # (module prefix, layer); the longest matching prefix decides
    ("qdeploy.core", 0), ("qdeploy.graph", 1), ("qdeploy.calibration", 2), ("qdeploy.targets", 2),
    ("qdeploy.stages", 3), ("qdeploy.pipeline.report", 4), ("qdeploy.pipeline", 5), ("qdeploy.pipeline.sweep", 6),
    ("qdeploy.api", 7), ("qdeploy", 7), ("qdeploy.cli", 8), ("qdeploy.__main__", 9),
)


def modules() -> dict[str, Path]:
    found = {}
    for package, folder in FOLDERS.items():
        for path in folder.rglob("*.py"):
            parts = path.relative_to(folder).with_suffix("").parts
            name = ".".join((package, *parts))
            found[name.removesuffix(".__init__")] = path
    return found


def imports_of(path: Path, known: set[str]) -> set[str]:
    """The qdeploy modules a file imports (a ``from package import module`` names the module)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [f"{node.module}.{alias.name}" for alias in node.names]
            found |= {name for name in names if name in known} or ({node.module} & known)
        elif isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name in known}
    return found


def layer_of(module: str) -> int:
    return max((prefix for prefix, _ in LAYERS if module == prefix or module.startswith(prefix + ".")),
               key=len, default=None) and dict(LAYERS)[max(
                   (prefix for prefix, _ in LAYERS if module == prefix or module.startswith(prefix + ".")), key=len)]


def graph() -> dict[str, set[str]]:
    found = modules()
    return {name: imports_of(path, set(found)) - {name} for name, path in found.items()}


def benchmark_modules() -> dict[str, Path]:
    """The scripts of benchmarks/ as modules (``benchmarks.x``): they import qdeploy and each other."""
    return {f"benchmarks.{path.stem}": path for path in sorted((ROOT / "benchmarks").glob("*.py"))}


def whole_graph() -> dict[str, set[str]]:
    """The import graph of the package and of benchmarks/ together."""
    found = {**modules(), **benchmark_modules()}
    return {name: imports_of(path, set(found)) - {name} for name, path in found.items()}


def private_owner(module: str) -> str | None:
    """Who may import a private module: its stage for a stage's internals (``qdeploy.stages.quantize``), else the
    package that holds it; None for a public module."""
    parts = module.split(".")
    private = next((index for index, part in enumerate(parts) if part.startswith("_") and part != "__init__"), None)
    if private is None:
        return None
    if parts[:2] == ["qdeploy", "stages"] and private > 2:
        return ".".join(parts[:3])
    return ".".join(parts[:private])


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one file (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for start in edges:
        if start in index:
            continue
        work = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found
