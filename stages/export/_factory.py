"""`model.torch.factory` found without running it: its file exists, parses, and defines the name.

``qdeploy check`` must refuse a misspelt factory as ``run`` would, but importing the user's file runs its code
(``check`` runs nothing).  So the file is parsed, not imported: a factory is found when the module defines the
name at its top level (a def, a class, an assignment or an import), also under a top-level if/try/with.  A
module that may define names no parser sees (``from x import *``, a module ``__getattr__``, compiled code) is
given the benefit of the doubt; the export stage then says what importing it found.
"""

from __future__ import annotations

import ast
import difflib
import sys
from collections.abc import Callable, Iterator
from importlib.machinery import ModuleSpec
from pathlib import Path

from qdeploy.core.errors import RecipeError, UserFileError
from qdeploy.core.userfiles import open_regular_file

__all__ = ["MAX_FACTORY_BYTES", "check_factory"]

FIELD = "model.torch.factory"
MAX_FACTORY_BYTES = 10_000_000
"""Largest factory source parsed: a Python module of this size is data, not a model definition."""
_ANY_NAME = "*"
_TRY = (ast.Try, getattr(ast, "TryStar", ast.Try))  # try/except* from Python 3.11


def check_factory(factory: str, resolve: Callable[[str], Path]) -> None:
    """RecipeError (field model.torch.factory) when the factory's module cannot be found or does not define it."""
    module_part, function = factory.rsplit(":", 1)
    if module_part.endswith(".py"):
        path: Path | None = resolve(module_part)
    else:
        if hasattr(sys.modules.get(module_part), function):
            return  # imported already (by qdeploy or the caller of the API): its names are known
        path = _module_source(module_part)
        if path is None:
            return  # compiled, built in or a namespace package: no source to read
    assert path is not None
    names = _defined_names(_parse(path, module_part))
    if function in names or _ANY_NAME in names:
        return
    close = difflib.get_close_matches(function, sorted(names), n=1)
    hint = f"did you mean '{close[0]}'? " if close else ""
    shown = ", ".join(sorted(names)[:12]) + (" ..." if len(names) > 12 else "") if names else "nothing"
    raise RecipeError(f"'{module_part}' ({path}) defines no '{function}' at its top level; {hint}it defines: "
                      f"{shown}", field=FIELD)


def _module_source(module_part: str) -> Path | None:
    """The source file of 'pkg.mod' found as import would find it, importing nothing; None when it has none or
    when a parent package may make its submodules at import time."""
    if not all(part.isidentifier() for part in module_part.split(".")):
        raise RecipeError(f"'{module_part}' is not a module name (dotted names) nor a .py file", field=FIELD)
    search: list[str] | None = None
    parent: ModuleSpec | None = None
    parts = module_part.split(".")
    for depth in range(len(parts)):
        name = ".".join(parts[:depth + 1])
        spec = _find_spec(name, search)
        if spec is None:
            if parent is not None and _extends_itself(parent):
                return None  # e.g. pkgutil.extend_path: its submodules are known once it has run
            raise RecipeError(f"module '{name}' cannot be found on the Python path; install it, or name its file "
                              "as 'path/to/file.py:function'", field=FIELD)
        parent, search = spec, list(spec.submodule_search_locations or [])
    origin = getattr(parent, "origin", None)
    return Path(origin) if origin and origin.endswith(".py") else None


def _find_spec(name: str, search: list[str] | None) -> ModuleSpec | None:
    """What import's own lookup finds (sys.modules, then each finder of sys.meta_path: editable installs too),
    without importing the parents (importlib.util.find_spec would run them)."""
    loaded = sys.modules.get(name)
    if loaded is not None:
        return getattr(loaded, "__spec__", None) or ModuleSpec(name, None)
    for finder in sys.meta_path:
        find = getattr(finder, "find_spec", None)
        try:
            spec = find(name, search) if find is not None else None
        except Exception:  # a third-party finder failing on a name is not the user's error
            continue
        if spec is not None:
            return spec
    return None


def _extends_itself(package: ModuleSpec) -> bool:
    """A package whose __init__ changes its own __path__ or sys.modules: its submodules cannot be known unrun."""
    origin = package.origin
    if not origin or not origin.endswith(".py"):
        return True
    try:
        with open_regular_file(Path(origin), "package") as stream:
            source = stream.read(MAX_FACTORY_BYTES)
    except UserFileError:
        return True
    return b"__path__" in source or b"sys.modules" in source


def _parse(path: Path, module_part: str) -> ast.Module:
    try:
        with open_regular_file(path, "factory file") as stream:
            source = stream.read(MAX_FACTORY_BYTES + 1)
    except UserFileError as exc:
        raise RecipeError(str(exc), field=FIELD) from None
    if len(source) > MAX_FACTORY_BYTES:
        raise RecipeError(f"{path} is above {MAX_FACTORY_BYTES / 1e6:.0f} MB: not a model's Python source",
                          field=FIELD)
    try:
        return ast.parse(source, filename=str(path))
    except SyntaxError as exc:
        where = f"{path}:{exc.lineno}" if exc.lineno else str(path)
        raise RecipeError(f"{where}: the factory's file '{module_part}' cannot be parsed: {exc.msg}",
                          field=FIELD) from None
    except (ValueError, UnicodeDecodeError) as exc:  # a NUL byte, an undecodable source
        raise RecipeError(f"{path}: the factory's file cannot be parsed: {exc}", field=FIELD) from None
    except (RecursionError, MemoryError):
        raise RecipeError(f"{path}: the factory's file nests too deeply for Python's parser", field=FIELD) from None


def _defined_names(tree: ast.Module) -> set[str]:
    """Names a module binds at its top level; '*' when it may bind names no parser can list."""
    names: set[str] = set()
    for node in _top_level(tree.body):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {leaf.id for target in targets for leaf in ast.walk(target) if isinstance(leaf, ast.Name)}
        elif isinstance(node, ast.Import | ast.ImportFrom):
            for alias in node.names:
                names.add(_ANY_NAME if alias.name == "*" else alias.asname or alias.name.split(".")[0])
    if "__getattr__" in names:
        names.add(_ANY_NAME)  # PEP 562: the module answers any name at run time
    return names


def _top_level(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """Statements of a module body, and of the if/try/with blocks at its top level (conditional definitions)."""
    for node in body:
        yield node
        if isinstance(node, ast.If | ast.With | ast.AsyncWith):
            yield from _top_level(node.body + getattr(node, "orelse", []))
        elif isinstance(node, _TRY):
            blocks = node.body + node.orelse + node.finalbody
            yield from _top_level(blocks + [stmt for handler in node.handlers for stmt in handler.body])
