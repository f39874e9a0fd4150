"""Every name a module exports (its ``__all__``) is defined in one module only, so a name says what it is.

Read from the sources (nothing is imported): a module defines a name by ``def``, ``class`` or a top-level
assignment; importing it from elsewhere (a re-export) defines nothing.  ``import qdeploy`` exposes
``qdeploy.api``'s names, which are covered as ``qdeploy.api``'s.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# folder of the checkout -> its package once installed (pyproject.toml's package-dir)
PACKAGES = {"qdeploy": "qdeploy", "pipeline": "qdeploy.pipeline", "stages": "qdeploy.stages",
            "calibration": "qdeploy.calibration"}

STAGES = ("export", "simplify", "fp16", "quantize", "validate", "benchmark")
ALLOWED = {
    # the stage protocol: the runner calls each stage module's `run` (qdeploy.pipeline.recipe.registry)
    *(("run", f"qdeploy.stages.{stage}") for stage in STAGES),
    # each stage's name, as its errors and findings spell it
    ("STAGE", "qdeploy.stages.simplify.config"), ("STAGE", "qdeploy.stages.quantize.config"),
    ("STAGE", "qdeploy.stages.quantize.lower"),
    # modules run as scripts (`python -m ...`, `python check.py`) start at `main`
    ("main", "qdeploy.pipeline.recipe.docs"), ("main", "qdeploy.pipeline.publish.package.check"),
    # the check script shipped inside each package runs without qdeploy: it keeps its own copies
    ("sha256_file", "qdeploy.pipeline.publish.package.check"), ("SNR_CAP_DB", "qdeploy.pipeline.publish.package.check"),
}


def _modules() -> dict[str, Path]:
    found = {}
    for folder, package in PACKAGES.items():
        for path in sorted((REPO / folder).rglob("*.py")):
            parts = path.relative_to(REPO / folder).with_suffix("").parts
            parts = parts[:-1] if parts[-1] == "__init__" else parts
            found[".".join((package, *parts))] = path
    return found


def _exported(tree: ast.Module, path: Path) -> list[str]:
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            names = ast.literal_eval(node.value)
            assert isinstance(names, list | tuple), f"{path}: __all__ is not a literal list"
            return list(names)
    return []


def _defined(tree: ast.Module) -> set[str]:
    names = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return names


def _imported(tree: ast.Module) -> dict[str, tuple[str, str]]:
    """Name bound by a top-level ``from module import name [as other]`` -> (module, name)."""
    return {alias.asname or alias.name: (node.module, alias.name) for node in tree.body
            if isinstance(node, ast.ImportFrom) and node.module for alias in node.names}


def definitions() -> dict[str, list[str]]:
    """Exported name -> the modules that define it: a module exporting it, or the module a re-export is from."""
    paths = _modules()
    trees = {module: ast.parse(path.read_text(encoding="utf-8")) for module, path in paths.items()}
    defined = {module: _defined(tree) for module, tree in trees.items()}
    where: dict[str, set[str]] = defaultdict(set)
    for module, tree in trees.items():
        imported = _imported(tree)
        for name in _exported(tree, paths[module]):
            if name in defined[module] and name != "__all__":
                where[name].add(module)
            elif name in imported and imported[name][1] in defined.get(imported[name][0], ()):
                where[name].add(imported[name][0])  # a re-export: the name means what its source defines
    return {name: sorted(modules) for name, modules in where.items()}


def test_each_exported_name_is_defined_in_one_module() -> None:
    repeated = {name: modules for name, modules in definitions().items()
                if len([m for m in modules if (name, m) not in ALLOWED]) > 1}
    assert not repeated, f"names defined in several modules (rename one, or allow it in ALLOWED): {repeated}"


def test_the_allow_list_names_real_definitions() -> None:
    where = definitions()
    stale = sorted((name, module) for name, module in ALLOWED if module not in where.get(name, []))
    assert not stale, f"ALLOWED entries that no longer match an exported definition: {stale}"


def test_the_walk_sees_the_packages() -> None:
    """The test would pass vacuously if it read no modules."""
    where = definitions()
    assert where["compare_outputs"] == ["qdeploy.core.compare"]
    assert "qdeploy.stages.fp16" in where["run"] and "qdeploy.api" in where["run"]


def test_the_registry_refers_to_modules_models_and_functions() -> None:
    """No stage is wired by a string looked up later: its package, settings model and functions are held."""
    from types import ModuleType

    from qdeploy.pipeline.recipe import registry
    from qdeploy.stages.fp16.config import Fp16Config
    from qdeploy.stages.quantize.config import QuantizeConfig

    for info in registry.all_stages():
        assert isinstance(info.module, ModuleType) and callable(info.function())
        assert callable(info.config.model_validate)
        assert callable(info.datasets_used) and callable(info.reads_default_dataset)
    fp16, quantize = registry.stage("fp16"), registry.stage("quantize")
    assert fp16.datasets_used(Fp16Config(calibration={"data": "cal"})) == ["cal"]
    assert fp16.reads_default_dataset(Fp16Config()) and not fp16.reads_default_dataset(Fp16Config(calibration={}))
    ptq = QuantizeConfig.model_validate({"calibration": {"data": "cal"}, "budget": {"data": "held"},
                                         "tolerance": {"cosine_min": 0.99}})
    assert quantize.datasets_used(ptq) == ["cal", "held"]
    assert quantize.datasets_used(QuantizeConfig.model_validate({"mode": "weight_only"})) == []
