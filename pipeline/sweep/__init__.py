"""Sweeps: many recipes run as one job, from recipe files or a matrix of models x variant sets x targets.

A sweep file is YAML with a ``sweep`` name and ``recipes`` (files or glob
patterns) and/or a ``matrix``:

```yaml
sweep: release-42
recipes: [recipes/*.yaml]
matrix:
  models:
    - {name: cnn, model: {onnx: models/cnn.onnx}, data: {calib: {reader: npy, path: data/cnn}}}
  variant_sets:
    cpu-precisions: {fp32: [simplify], int8: [simplify, {quantize: {calibration: {data: calib}}}]}
  targets: {cpu: [ort:cpu, openvino:cpu], cuda: [ort:cuda]}
  recipe: {validate: {reference: fp32}, benchmark: {iterations: 100}}
```

Each (model, variant set, target set) becomes a recipe named ``<model>-<set>-<targets>``; paths in the matrix
are relative to the sweep file.  A recipe that does not load is an invalid entry of the plan, never a reason to
drop the others.  Running the plan is ``qdeploy.pipeline.sweep.executors.run_sweep``.
"""

from __future__ import annotations

import glob
import logging
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import Field, ValidationError, field_validator, model_validator

from qdeploy.core.errors import QdeployError, QdeployInputError, RecipeError
from qdeploy.core.runtimes import artifact_of
from qdeploy.core.tolerance import StrictModel
from qdeploy.pipeline.recipe.schema import EXPORTED, Recipe, StepError
from qdeploy.targets import get_target

__all__ = ["SWEEP_KEYS", "MatrixModel", "MatrixSpec", "SweepEntry", "SweepFile", "SweepPlan", "check_entries",
           "describe_sweep", "expand_matrix", "is_sweep_file", "load_sweep", "parse_sweep_file"]

log = logging.getLogger(__name__)

SWEEP_KEYS = ("sweep", "recipes", "matrix")
"""Top-level keys of a sweep file; a file with one of them and no 'model' is a sweep, not a recipe."""
_NAME = r"[A-Za-z0-9][A-Za-z0-9_.-]*"
_FROM_MATRIX = ("name", "model", "variants", "targets")


class MatrixModel(StrictModel):
    """One model of the matrix: a recipe's model section and the datasets it needs."""

    name: str = Field(description="Short name of the model; it starts the names of its recipes.")
    model: dict[str, Any] = Field(description="The recipe's model section (onnx or torch, inputs, opset).")
    data: dict[str, Any] = Field(default_factory=dict,
                                 description="Datasets of this model, added over matrix.recipe.data.")

    @field_validator("name")
    @classmethod
    def _safe_name(cls, value: str) -> str:
        return _check_name(value, "model name")


class MatrixSpec(StrictModel):
    """Models x variant sets x target sets, each combination one recipe."""

    models: list[MatrixModel] = Field(min_length=1, description="Models to prepare.")
    variant_sets: dict[str, dict[str, Any]] = Field(
        min_length=1, description="Named sets of variants, each written as a recipe's variants section.")
    targets: dict[str, list[str]] | list[str] = Field(
        description="Named target sets, or a list of targets each run as a set of its own.")
    recipe: dict[str, Any] = Field(
        default_factory=dict,
        description="Recipe sections every expanded recipe shares (data, validate, benchmark, gates, report); "
                    "a gate is kept in the recipes whose variants and targets it names.")

    @field_validator("variant_sets")
    @classmethod
    def _set_names(cls, value: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
        for name in value:
            _check_name(name, "variant set name")
        return value

    @field_validator("targets")
    @classmethod
    def _target_sets(cls, value: dict[str, list[str]] | list[str]) -> dict[str, list[str]] | list[str]:
        sets = value if isinstance(value, dict) else {target: [target] for target in value}
        if not sets:
            raise ValueError("targets is empty; name at least one target")
        for name, targets in sets.items():
            if isinstance(value, dict):
                _check_name(name, "target set name")
            if not targets:
                raise ValueError(f"target set '{name}' is empty")
        return value

    @field_validator("recipe")
    @classmethod
    def _shared_sections(cls, value: dict[str, Any]) -> dict[str, Any]:
        taken = [key for key in _FROM_MATRIX if key in value]
        if taken:
            raise ValueError(f"matrix.recipe may not set {', '.join(taken)}: the matrix decides them")
        return value

    @model_validator(mode="after")
    def _unique_models(self) -> MatrixSpec:
        names = [model.name for model in self.models]
        repeated = sorted({name for name in names if names.count(name) > 1})
        if repeated:
            raise ValueError(f"model names repeat: {', '.join(repeated)}")
        return self

    def target_sets(self) -> dict[str, list[str]]:
        """Target sets by name; a bare list's 'ort:cpu' is the set 'ort-cpu'."""
        if isinstance(self.targets, dict):
            return self.targets
        return {target.replace(":", "-"): [target] for target in self.targets}


MAX_RECIPES = 1000
"""Default cap on a matrix's expansion: an 8 KB sweep file could ask for 100,000 recipes (minutes, gigabytes)."""


class SweepFile(StrictModel):
    """A whole sweep file."""

    sweep: str = Field(description="Name of the sweep; the default output folder is runs/<sweep>/.")
    recipes: list[str] = Field(default_factory=list,
                               description="Recipe files or glob patterns, relative to the sweep file.")
    matrix: MatrixSpec | None = Field(default=None, description="A matrix expanded into recipes.")
    max_recipes: int = Field(default=MAX_RECIPES, ge=1,
                             description="Most recipes the matrix may expand into (models x variant sets x target "
                                         "sets); raise it deliberately for a larger sweep.")

    @field_validator("recipes")
    @classmethod
    def _globs_stay_here(cls, patterns: list[str]) -> list[str]:
        for pattern in patterns:
            wild = glob.has_magic(pattern)
            if wild and (Path(pattern).is_absolute() or ".." in Path(pattern).parts):
                raise ValueError(f"recipes entry '{pattern}': a pattern matches files under the sweep file's folder "
                                 "only; name a file outside it by its own path, one entry each")
        return patterns

    @model_validator(mode="after")
    def _bounded(self) -> SweepFile:
        if self.matrix is not None:
            count = len(self.matrix.models) * len(self.matrix.variant_sets) * len(self.matrix.target_sets())
            if count > self.max_recipes:
                raise ValueError(f"the matrix expands into {count} recipes, more than max_recipes "
                                 f"({self.max_recipes}); trim it, or set max_recipes to at least {count}")
        return self

    @field_validator("sweep")
    @classmethod
    def _safe_name(cls, value: str) -> str:
        return _check_name(value, "sweep name")

    @model_validator(mode="after")
    def _has_work(self) -> SweepFile:
        if not self.recipes and self.matrix is None:
            raise ValueError("a sweep needs 'recipes' or a 'matrix'")
        return self


@dataclass
class SweepEntry:
    """One recipe of a sweep, loaded, or the reason it is invalid."""

    name: str
    """Unique in the sweep: the recipe's folder under the sweep's output folder."""
    origin: str
    """Where it comes from: a recipe file, or 'file: matrix model x set x targets'."""
    recipe: Recipe | None = None
    error: str | None = None

    @property
    def valid(self) -> bool:
        return self.recipe is not None


@dataclass
class SweepPlan:
    """Every recipe of a sweep, in order."""

    name: str
    entries: list[SweepEntry] = field(default_factory=list)

    @property
    def invalid(self) -> list[SweepEntry]:
        return [entry for entry in self.entries if not entry.valid]


def _check_name(value: str, what: str) -> str:
    if not re.fullmatch(_NAME, value):
        raise ValueError(f"{what} '{value}' may hold letters, digits, '_', '.', '-' and must start with a letter "
                         "or digit")
    return value


def is_sweep_file(path: Path) -> bool:
    """A YAML mapping with a sweep key (sweep, recipes, matrix) and no 'model' key is a sweep file."""
    # lazy: pulls onnxruntime (import cost)
    from qdeploy.pipeline.recipe.loader import parse_yaml, read_yaml_text

    try:
        _, data = parse_yaml(read_yaml_text(path, "recipe"), str(path))
    except RecipeError:
        return False
    return isinstance(data, dict) and "model" not in data and any(key in data for key in SWEEP_KEYS)


def load_sweep(paths: list[Path], name: str | None = None) -> SweepPlan:
    """The plan of recipe files and sweep files given on the command line.

    A malformed sweep file raises RecipeError (exit 2); a recipe that does not load becomes an invalid entry.
    """
    entries: list[SweepEntry] = []
    sweep_names: list[str] = []
    seen: set[Path] = set()
    for path in paths:
        if is_sweep_file(path):
            spec = parse_sweep_file(path)
            sweep_names.append(spec.sweep)
            entries += _expand(spec, path, seen)
        else:
            entries += _recipe_entries([path], seen)
    _unique_names(entries)
    return SweepPlan(name=name or (sweep_names[0] if len(sweep_names) == 1 else "sweep"), entries=entries)


def parse_sweep_file(path: Path) -> SweepFile:
    """Validate a sweep file; RecipeError names the file, line and field of the first problem."""
    # lazy: pulls onnxruntime (import cost)
    from qdeploy.pipeline.recipe.loader import document_loc, node_line, parse_yaml, read_yaml_text

    file = str(path)
    root, data = parse_yaml(read_yaml_text(path, "sweep"), file)
    try:
        return SweepFile.model_validate(data)
    except ValidationError as exc:
        # a misspelt key shows as an unknown key plus a missing one: the unknown key is the cause
        error = sorted(exc.errors(), key=lambda e: e["type"] != "extra_forbidden")[0]
        loc = document_loc(root, tuple(error["loc"]))
        message = error["msg"].removeprefix("Value error, ")
        if error["type"] == "extra_forbidden":
            message = f"unknown field '{error['loc'][-1]}' of the sweep file"
        line = node_line(root, loc) if root is not None else None
        raise RecipeError(message, file=file, line=line, field=".".join(map(str, loc)) or None) from None


def _recipe_entries(paths: list[Path], seen: set[Path]) -> list[SweepEntry]:
    # lazy: pulls onnxruntime (import cost)
    from qdeploy.pipeline.recipe.loader import load_recipe_file

    entries = []
    for path in paths:
        resolved = path.resolve()
        if resolved in seen:
            continue  # the same file twice (a glob and a name) is one recipe
        seen.add(resolved)
        if is_sweep_file(path):
            entries.append(SweepEntry(name=path.stem, origin=str(path),
                                      error=f"{path} is a sweep file; a sweep file lists recipes, not other sweeps"))
            continue
        try:
            recipe = load_recipe_file(path)
        except QdeployError as exc:
            entries.append(SweepEntry(name=path.stem, origin=str(path), error=str(exc)))
            continue
        entries.append(SweepEntry(name=recipe.name, origin=str(path), recipe=recipe))
    return entries


def _expand(spec: SweepFile, path: Path, seen: set[Path]) -> list[SweepEntry]:
    entries: list[SweepEntry] = []
    seen.add(path.resolve())  # a glob such as '*.yaml' also matches the sweep file itself
    for pattern in spec.recipes:
        matches = sorted(glob.glob(str(path.parent / pattern), recursive=True))
        if not matches:
            entries.append(SweepEntry(name=Path(pattern).stem.replace("*", "x") or "recipe",
                                      origin=f"{path}: {pattern}",
                                      error=f"{path}: recipes entry '{pattern}' matches no file"))
        entries += _recipe_entries([Path(match) for match in matches], seen)
    if spec.matrix is not None:
        entries += expand_matrix(spec.matrix, path)
    return entries


def expand_matrix(matrix: MatrixSpec, sweep_path: Path) -> list[SweepEntry]:
    """One entry per model x variant set x target set, paths relative to the sweep file."""
    entries = []
    for model in matrix.models:
        for set_name, variants in matrix.variant_sets.items():
            for targets_name, targets in matrix.target_sets().items():
                name = f"{model.name}-{set_name}-{targets_name}"
                origin = f"{sweep_path}: matrix model {model.name} x variants {set_name} x targets {targets_name}"
                try:
                    recipe = _matrix_recipe(matrix, model, name, variants, targets, sweep_path)
                except RecipeError as exc:
                    entries.append(SweepEntry(name=name, origin=origin, error=str(exc)))
                    continue
                entries.append(SweepEntry(name=name, origin=origin, recipe=recipe))
    return entries


def _matrix_recipe(matrix: MatrixSpec, model: MatrixModel, name: str, variants: dict[str, Any],
                   targets: list[str], sweep_path: Path) -> Recipe:
    shared = dict(matrix.recipe)
    gates, data = shared.pop("gates", None) or [], shared.get("data") or {}
    if isinstance(gates, list):  # other shapes of gates and data go to validation as they are: it names the field
        gates = [gate for gate in gates if _gate_of(gate, set(variants) | {EXPORTED}, targets)]
    body = {**shared, "name": name, "model": model.model, "data": {**data, **model.data} if isinstance(data, dict)
            else data, "variants": variants, "targets": targets, "gates": gates}
    where = f"recipe {name} of the matrix"
    try:
        recipe = Recipe.model_validate(body)
    except ValidationError as exc:
        raise RecipeError(f"{where}: {_validation_message(exc)}", file=str(sweep_path)) from None
    recipe._source = sweep_path.resolve()
    _check_files(recipe, where, sweep_path)
    return recipe


def _gate_of(gate: Any, variants: set[str], targets: list[str]) -> bool:
    """Whether a shared gate belongs to this recipe.  A gate whose variant is no name (a list, a mapping) stays, so
    that validation names its field: as a set member it would raise TypeError (an internal error)."""
    if not isinstance(gate, dict) or not isinstance(gate.get("variant"), str | None):
        return True
    variant = gate.get("variant")
    named = artifact_of(variant) if isinstance(variant, str) else variant  # 'int4@f32': a row of int4
    return named in variants and gate.get("target") in targets


def _validation_message(exc: ValidationError) -> str:
    error = exc.errors()[0]
    cause = (error.get("ctx") or {}).get("error")
    if isinstance(cause, StepError):
        return f"field 'variants.{cause.variant}[{cause.index}]': {cause.message}"
    loc = ".".join(str(part) for part in error["loc"] if not (isinstance(part, str) and "[" in part))
    message = error["msg"].removeprefix("Value error, ")
    if error["type"] == "extra_forbidden":
        message = "unknown field; check its spelling against `qdeploy schema`"
    return f"field '{loc}': {message}" if loc else message


def _check_files(recipe: Recipe, where: str, sweep_path: Path) -> None:
    """The file checks of a recipe file's loading (regular files only, data folders that stay inside themselves, the
    factory's name), for a recipe the matrix made: a /dev/zero model or a FIFO is refused here as there."""
    # lazy: pulls onnxruntime (import cost)
    from qdeploy.pipeline.recipe.loader import check_recipe_files

    try:
        check_recipe_files(recipe, None, str(sweep_path))
    except RecipeError as exc:
        field = f"field '{exc.field}': " if exc.field else ""
        raise RecipeError(f"{where}: {field}{exc.detail}", file=str(sweep_path)) from None


def check_entries(plan: SweepPlan) -> None:
    """What `qdeploy check` verifies of a recipe beyond loading it (the model, the datasets against its inputs), for
    each valid entry: one the run would refuse becomes invalid, with the reason.  Entries that share a model and
    datasets (a matrix's variant and target sets) are checked once."""
    import json

    # lazy: pulls onnxruntime (import cost)
    from qdeploy.pipeline.recipe.preflight import check_before_run, datasets_read

    seen: dict[str, str | None] = {}
    for entry in plan.entries:
        recipe = entry.recipe
        if recipe is None:
            continue
        key = json.dumps([str(recipe.base_dir), recipe.model.model_dump(mode="json"),
                          {name: recipe.data[name].model_dump(mode="json") for name in datasets_read(recipe)}])
        if key not in seen:
            try:
                check_before_run(recipe)
                seen[key] = None
            except QdeployInputError as exc:
                seen[key] = str(exc)
        if seen[key] is not None:
            entry.recipe, entry.error = None, f"{entry.origin}: {seen[key]}"


def _unique_names(entries: list[SweepEntry]) -> None:
    """Two recipes with one name would share a folder: the later ones get -2, -3..."""
    counts: dict[str, int] = {}
    for entry in entries:
        counts[entry.name] = counts.get(entry.name, 0) + 1
        if counts[entry.name] > 1:
            renamed = f"{entry.name}-{counts[entry.name]}"
            log.warning("recipe name %s repeats (%s); its folder is %s", entry.name, entry.origin, renamed)
            entry.name = renamed


def describe_sweep(plan: SweepPlan) -> str:
    """The expanded plan of a sweep: each recipe with its variants, targets and gates, or why it is invalid."""
    valid = [entry for entry in plan.entries if entry.valid]
    lines = [f"sweep {plan.name}: {len(plan.entries)} recipes, {len(valid)} valid, {len(plan.invalid)} invalid", ""]
    targets: dict[str, None] = {}
    for entry in plan.entries:
        lines.append(f"- {entry.name}  ({entry.origin})")
        if entry.recipe is None:
            lines.append(f"    INVALID: {entry.error}")
            continue
        recipe = entry.recipe
        targets.update(dict.fromkeys(recipe.targets))
        chains = ", ".join(f"{name} [{' > '.join(step.stage for step in steps) or 'as exported'}]"
                           for name, steps in recipe.variants.items())
        batches = recipe.benchmark.batch_sizes if recipe.benchmark.enabled else "off"
        lines += [f"    variants: {chains}",
                  f"    targets: {', '.join(recipe.targets)}; reference {recipe.reference_variant}; "
                  f"benchmark batches {batches}; gates {len(recipe.gates)}"]
    if targets:
        lines += ["", "targets on this machine:"]
        for target in targets:
            available, reason = get_target(target).availability()
            lines.append(f"  - {target}: {'available' if available else 'unavailable: ' + reason}")
    return "\n".join(lines)
