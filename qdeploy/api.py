"""qdeploy's Python API: what ``qdeploy run``, ``compare`` and ``sweep`` do, as functions with typed results.

    import qdeploy
    result = qdeploy.run("recipe.yaml")                     # or a dict, or a Recipe
    result = qdeploy.run({"name": "m", "model": {}, "variants": {"fp16": ["fp16"]}}, model=onnx_model)
    result.passed, result.exit_code, result.artifacts["fp16"].path

The CLI is a thin layer over these functions.  An in-memory model (``onnx.ModelProto`` or a torch
``nn.Module``) never goes into the recipe: it is written once, by content, to ``<cache>/sources/<sha256>/`` and
the recipe's ``model.onnx`` points there, so the export stage's cache key (which hashes that file) is the same
for the same weights and changes with any of them.
"""

from __future__ import annotations

import copy
import hashlib
import os
import tempfile
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from qdeploy.core.context import artifact_precision
from qdeploy.core.errors import QdeployInputError, RecipeError
from qdeploy.core.report import Report, as_report
from qdeploy.core.rows import (
    BenchmarkRow,
    BuildFailure,
    GateResult,
    ThroughputRow,
    UnmeasuredEntry,
    ValidationRow,
)
from qdeploy.core.runtimes import variants_named
from qdeploy.core.userfiles import writable_folder
from qdeploy.pipeline.recipe.schema import SAFE_NAME, Recipe
from qdeploy.pipeline.report.layers import explain_text
from qdeploy.pipeline.results.compare_runs import Thresholds, compare_reports, load_report
from qdeploy.stages.export import export_module
from qdeploy.stages.export.config import ExportConfig

__all__ = ["ArtifactInfo", "BenchmarkRow", "BuildFailure", "GateResult", "Recipe", "RunResult", "ThroughputRow",
           "UnmeasuredEntry", "ValidationRow", "compare", "explain", "load_recipe", "open_run", "run", "sweep"]

RecipeSource = str | Path | dict[str, Any] | Recipe


@dataclass(frozen=True)
class ArtifactInfo:
    """One published artifact of a run (a row of report.json's ``artifacts``)."""

    name: str
    path: Path
    sha256: str
    size_bytes: int
    precision: str
    stages: tuple[str, ...]


@dataclass
class RunResult:
    """A finished run: report.json as a dict (``report``), the same typed (``report_model``) and views of it, and
    the exit status ``qdeploy run`` gives."""

    report: dict[str, Any]
    out_dir: Path
    exit_code: int
    artifacts: dict[str, ArtifactInfo] = field(default_factory=dict)

    @cached_property
    def report_model(self) -> Report:
        """report.json as the typed model every reader of qdeploy reads (``qdeploy.core.report.Report``)."""
        return as_report(self.report, f"{self.out_dir / 'report.json'}")

    @property
    def passed(self) -> bool:
        return self.report_model.passed

    @property
    def validation(self) -> list[ValidationRow]:
        """report.json's ``validation`` rows, typed (``row.to_json()`` gives the dict back)."""
        return list(self.report_model.validation)

    @property
    def benchmarks(self) -> list[BenchmarkRow]:
        """report.json's ``benchmarks`` (latency) rows, typed."""
        return list(self.report_model.benchmarks)

    @property
    def throughput(self) -> list[ThroughputRow]:
        """report.json's ``throughput`` rows (benchmark.mode throughput or both), typed."""
        return list(self.report_model.throughput)

    @property
    def gates(self) -> list[GateResult]:
        """report.json's ``gates``, typed: each gate with its value, passed (None when skipped) and reason."""
        return list(self.report_model.gates)

    @property
    def failures(self) -> list[BuildFailure]:
        """report.json's ``failures``, typed: the variants that did not build, with the stage and why."""
        return list(self.report_model.failures)

    @property
    def unmeasured(self) -> list[UnmeasuredEntry]:
        """report.json's ``unmeasured``, typed: what the recipe asked to measure and could not be."""
        return list(self.report_model.unmeasured)

    def __repr__(self) -> str:
        return (f"RunResult({self.report_model.recipe.name!r}, passed={self.passed}, "
                f"artifacts={sorted(self.artifacts)}, out_dir={str(self.out_dir)!r})")


def load_recipe(source: RecipeSource, *, base_dir: str | Path | None = None) -> Recipe:
    """A validated recipe from a YAML file, a dict or a Recipe (a copy).

    A dict goes through the same checks as a file; its relative paths (model, data, factories) resolve against
    ``base_dir``, default the current folder (a file's resolve against the file's folder).  A dict has no file
    and no lines: its errors name the field, "recipe (dict): field 'quantize.mode': ...".  Path objects in it
    are taken as text."""
    # lazy: pulls onnxruntime (import cost)
    from qdeploy.pipeline.recipe.loader import load_recipe_file

    if isinstance(source, Recipe):
        return source.model_copy(deep=True)
    if isinstance(source, dict):
        return _parse_dict(copy.deepcopy(source), base_dir)
    if not isinstance(source, str | os.PathLike):
        raise RecipeError(f"a recipe is a YAML file's path, a dict or a Recipe, not a {type(source).__name__}",
                          file="recipe")
    return load_recipe_file(Path(source))


DICT_RECIPE = "recipe (dict)"
"""What errors of a recipe given as a dict name instead of a file: it has no file and no lines."""
_PLAIN = (str, int, float, bool, type(None))


def _parse_dict(data: dict[str, Any], base_dir: str | Path | None, file: str = DICT_RECIPE) -> Recipe:
    import yaml

    # lazy: pulls onnxruntime (import cost)
    from qdeploy.pipeline.recipe.loader import parse_recipe

    folder = Path(base_dir or Path.cwd()).resolve()
    text = yaml.safe_dump(_plain(data, ()), sort_keys=False)
    try:  # the file loader's checks and messages, on the dict dumped as YAML: anchored at base_dir
        return parse_recipe(text, source=folder / "<dict recipe>")
    except RecipeError as exc:  # the dump's file and lines are no place the user wrote: the field path is
        hint = " (a dict recipe's relative paths resolve against base_dir=, default the current folder)" \
            if file == DICT_RECIPE and "(resolved to " in exc.detail else ""
        raise RecipeError(exc.detail + hint, file=file, field=exc.field) from None


def _plain(value: Any, loc: tuple[Any, ...]) -> Any:
    """The dict's values as YAML's plain data (Path -> text, tuple -> list); a RecipeError naming the field of
    any other kind of value."""
    if type(value) in _PLAIN:
        return value
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if isinstance(value, dict):
        return {key: _plain(item, (*loc, key)) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(item, (*loc, index)) for index, item in enumerate(value)]
    for kind in (bool, int, float, str):  # subclasses (numpy's float64, a str enum): their plain value
        if isinstance(value, kind):
            return kind(value)
    raise RecipeError(f"a value of type {type(value).__name__}; a recipe holds text, numbers, booleans, lists, dicts",
                      file=DICT_RECIPE, field=".".join(map(str, loc)) or None)


def run(recipe: RecipeSource, model: Any = None, *, out: str | Path | None = None,
        cache_dir: str | Path | None = None, variants: list[str] | None = None, targets: list[str] | None = None,
        use_cache: bool = True, progress: bool = False, base_dir: str | Path | None = None) -> RunResult:
    """Run a recipe end to end as ``qdeploy run`` does (same report, same exit status) and return it typed.

    ``model``: an ``onnx.ModelProto`` or a torch ``nn.Module`` used instead of the recipe's ``model.onnx`` /
    ``model.torch`` (the recipe names neither; a torch module needs ``model.inputs`` with shapes).
    ``base_dir``: the folder a dict recipe's relative paths (model, data, factories) resolve against, default the
    current folder (a recipe file's resolve against the file's folder).  Errors in a dict recipe name its field
    ("recipe (dict): field 'quantize.mode': ..."), as ``load_recipe`` does.
    """
    # lazy: pulls onnxruntime (import cost)
    from qdeploy.pipeline.run.runner import RunOptions, default_out_dir, run_recipe

    if model is not None:
        loaded = _with_in_memory_model(recipe, model, base_dir, cache_dir, out)
    else:
        loaded = load_recipe(recipe, base_dir=base_dir)
    out_dir = writable_folder(Path(out) if out is not None else default_out_dir(loaded), "out folder")
    cache = writable_folder(Path(cache_dir), "cache folder") if cache_dir is not None else None
    options = RunOptions(out_dir=out_dir, cache_dir=cache, use_cache=use_cache, variants=variants, targets=targets,
                         show_progress=progress)
    result = run_recipe(loaded, options)
    return _typed(result.report, result.out_dir, result.exit_code)


def _with_in_memory_model(recipe: RecipeSource, model: Any, base_dir: str | Path | None,
                          cache_dir: str | Path | None, out: str | Path | None) -> Recipe:
    """The recipe with ``model.onnx`` pointing at the in-memory model, written by content under the cache."""
    file = DICT_RECIPE
    if isinstance(recipe, Recipe):
        data = recipe.model_dump(mode="json", by_alias=True, exclude_unset=True)
        base_dir = base_dir or recipe.base_dir
        file = str(recipe.source or "recipe")
    elif isinstance(recipe, dict):
        data = copy.deepcopy(recipe)
    else:
        # lazy: pulls onnxruntime (import cost)
        from qdeploy.pipeline.recipe.loader import parse_yaml, read_yaml_text

        path = Path(recipe)
        data = parse_yaml(read_yaml_text(path, "recipe"), str(path))[1]  # the recipe loader's YAML, bombs refused
        base_dir = base_dir or path.resolve().parent
        file = str(path)
    section = data.setdefault("model", {}) if isinstance(data, dict) else None
    if not isinstance(section, dict):
        raise RecipeError("the recipe must be a mapping with a 'model' section", file=file, field="model")
    if section.get("onnx") or section.get("torch"):
        raise RecipeError("the model is given twice: as run(model=...) and in the recipe's model section; "
                          "drop one", file=file, field="model")
    name = data.get("name", "run")
    if not isinstance(name, str) or not SAFE_NAME.fullmatch(name):  # before anything is written under runs/<name>
        raise RecipeError(f"name {name!r} may hold letters, digits, '_', '.', '-' and must start with a letter or "
                          "digit (it names the run's folder)", file=file, field="name")
    cache = Path(cache_dir) if cache_dir else Path(out or Path("runs") / name) / "cache"
    section["onnx"] = str(write_model_source(model, section, cache.resolve()))
    return _parse_dict(data, base_dir, file)


def write_model_source(model: Any, section: dict[str, Any], cache: Path) -> Path:
    """``<cache>/sources/<sha256 of the ONNX bytes>/model.onnx``, written atomically once; a torch module is
    exported first with the section's inputs (and checked against its own outputs)."""
    import onnx

    if not isinstance(model, onnx.ModelProto):
        model = _export_module(model, section)
    data = model.SerializeToString()
    folder = cache / "sources" / hashlib.sha256(data).hexdigest()
    target = folder / "model.onnx"
    if not target.is_file():
        folder.mkdir(parents=True, exist_ok=True)
        fd, temporary = tempfile.mkstemp(prefix=".tmp-model.", dir=folder)
        with os.fdopen(fd, "wb") as stream:
            stream.write(data)
        os.replace(temporary, target)
    return target


def _export_module(module: Any, section: dict[str, Any]) -> Any:
    try:
        config = ExportConfig(**{**section, "onnx": "<in-memory>"})
    except Exception as exc:
        raise RecipeError(f"model section: {exc}", field="model") from None
    if not config.inputs or any(spec.shape is None for spec in config.inputs):
        raise RecipeError("an in-memory torch module needs model.inputs with name, shape and dtype", field="model")
    with tempfile.TemporaryDirectory(prefix="qdeploy-export-") as work:
        model, _ = export_module(module, config, Path(work))
    return model


def _typed(report: Report | dict[str, Any], out_dir: Path, exit_code: int) -> RunResult:
    typed = as_report(report, str(out_dir / "report.json"))
    artifacts = {row.name: ArtifactInfo(row.name, Path(row.path), row.sha256, row.size_bytes or 0,
                                        artifact_precision(row.stages, Path(row.path)), tuple(row.stages))
                 for row in typed.artifacts}
    result = RunResult(typed.to_json() if isinstance(report, Report) else report, out_dir, exit_code, artifacts)
    result.__dict__["report_model"] = typed  # parsed once
    return result


def open_run(folder: str | Path) -> RunResult:
    """A finished run folder (or its report.json) as a RunResult, without running anything.

    Every published file report.json names is checked against the sha256 it records and artifacts/SHA256SUMS
    first: a changed or missing one raises QdeployInputError naming it."""
    path = Path(folder)
    report_path = path / "report.json" if path.is_dir() else path
    # QdeployInputError (exit 2's error) for a missing or unreadable report, or published files that changed
    report = load_report(path, require_artifacts=True)
    return _typed(report, report_path.parent, 0 if report.passed else 1)


def explain(run: str | Path | RunResult, *, variant: str | None = None, target: str | None = None,
            top: int = 10) -> str:
    """``qdeploy explain`` as a function: where the time and the error come from, layer by layer, for the
    profiled pairs of a finished run (its ``layers`` section; docs/explain.md)."""
    report = run.report_model if isinstance(run, RunResult) else load_report(Path(run))
    if top < 1:
        raise QdeployInputError(f"--top {top}: give a whole number of at least 1")
    names = [row.name for row in report.artifacts]
    if variant is not None and not variants_named(variant, names):  # a recipe's name: its per-runtime builds
        raise QdeployInputError(f"variant '{variant}' is not in this run; its variants: {', '.join(names)}")
    targets = list(dict.fromkeys(row.target for row in report.validation))
    if target is not None and target not in targets:
        raise QdeployInputError(f"target '{target}' is not in this run; its targets: {', '.join(targets)}")
    if report.layers is None:
        raise QdeployInputError("this run has no layers section: it ran with report.layers: off or with a qdeploy "
                                "before the per-layer pass; run it again with report.layers: auto or full")
    return explain_text(report, variant, target, top)


def compare(run_a: str | Path | RunResult, run_b: str | Path | RunResult, *,
            max_latency_regression: float | None = None, max_metric_drop: dict[str, float] | None = None,
            allow_mismatch: bool = False) -> Any:
    """``qdeploy compare`` as a function: a RunComparison whose ``regressions`` decide pass or fail."""
    def report_of(item: str | Path | RunResult) -> Report:
        return item.report_model if isinstance(item, RunResult) else load_report(Path(item))

    thresholds = Thresholds(max_latency_regression, dict(max_metric_drop or {}))
    return compare_reports(report_of(run_a), report_of(run_b), thresholds, allow_mismatch=allow_mismatch)


def sweep(paths: str | Path | list[str | Path], *, out: str | Path | None = None, executor: str = "local",
          workers: int | None = None, cache_dir: str | Path | None = None, use_cache: bool = True) -> Any:
    """``qdeploy sweep`` as a function, on recipe and sweep files."""
    # lazy: pulls onnxruntime (import cost)
    from qdeploy.pipeline.sweep import load_sweep
    from qdeploy.pipeline.sweep.executors import SweepOptions, run_sweep

    if isinstance(paths, str | Path):  # one file, not a sequence of its characters
        paths = [paths]
    if executor not in ("local", "ray"):
        raise QdeployInputError(f"executor {executor!r}: choose 'local' or 'ray'")
    if workers is not None and (not isinstance(workers, int) or workers < 1):
        raise QdeployInputError(f"workers {workers!r}: a whole number of at least 1, or None for one per core")
    plan = load_sweep([Path(p) for p in paths])
    out_dir = Path(out) if out is not None else Path("runs") / plan.name
    options = SweepOptions(out_dir=out_dir, cache_dir=Path(cache_dir) if cache_dir else None, use_cache=use_cache,
                           executor=executor, workers=workers, address=None)  # type: ignore[arg-type]
    return run_sweep(plan, options)
