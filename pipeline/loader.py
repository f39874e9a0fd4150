"""Load a recipe file: YAML with line numbers in every error."""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from pipeline.errors import RecipeError
from pipeline.recipe import Recipe, StepError

Loc = tuple[str | int, ...]


def load_recipe(path: str | Path) -> Recipe:
    """Parse and validate a recipe file; RecipeError names the file, line and field on any problem."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise RecipeError("recipe file not found", file=str(path)) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise RecipeError(f"cannot read recipe: {exc}", file=str(path)) from None
    return parse_recipe(text, source=path)


def parse_recipe(text: str, *, source: Path | None = None) -> Recipe:
    """Validate recipe text; ``source`` anchors relative paths and error messages."""
    file = str(source) if source else "<recipe>"
    root = _compose(text, file)
    if not isinstance(root, yaml.MappingNode):
        raise RecipeError("a recipe is a YAML mapping (name, model, variants, ...)", file=file, line=_line(root))
    _refuse_duplicate_keys(root, file)
    data = yaml.safe_load(text)
    try:
        recipe = Recipe.model_validate(data)
    except ValidationError as exc:
        raise _recipe_error(exc, root, file) from None
    recipe._source = source.resolve() if source else None
    _check_paths(recipe, root, file)
    return recipe


def _compose(text: str, file: str) -> yaml.Node | None:
    try:
        return yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark else None
        raise RecipeError(f"YAML syntax error: {exc.problem or exc}", file=file, line=line) from None
    except yaml.YAMLError as exc:
        raise RecipeError(f"YAML error: {exc}", file=file) from None


def _line(node: yaml.Node | None) -> int | None:
    return node.start_mark.line + 1 if node is not None else None


def _refuse_duplicate_keys(node: yaml.Node, file: str) -> None:
    if isinstance(node, yaml.MappingNode):
        seen: dict[str, int | None] = {}
        for key, value in node.value:
            name = str(key.value)
            if name in seen:
                raise RecipeError(f"key '{name}' repeats (first at line {seen[name]}); each key may appear once",
                                  file=file, line=_line(key))
            seen[name] = _line(key)
            _refuse_duplicate_keys(value, file)
    elif isinstance(node, yaml.SequenceNode):
        for item in node.value:
            _refuse_duplicate_keys(item, file)


def _child(node: yaml.Node | None, key: str | int) -> tuple[yaml.Node | None, yaml.Node | None]:
    """(key node, value node) of a mapping key or sequence index; (None, None) when absent."""
    if isinstance(node, yaml.MappingNode):
        for key_node, value in node.value:
            if str(key_node.value) == str(key):
                return key_node, value
    if isinstance(node, yaml.SequenceNode) and isinstance(key, int) and 0 <= key < len(node.value):
        return node.value[key], node.value[key]
    return None, None


def node_line(root: yaml.Node, loc: Loc) -> int | None:
    """Line of the deepest node of ``loc`` that exists in the YAML tree."""
    node: yaml.Node | None = root
    line = _line(root)
    for part in loc:
        key_node, value = _child(node, part)
        if value is None:
            break
        # an unknown key is best shown at the key itself; a bad value at its value
        line = _line(key_node if isinstance(part, str) and not _is_leaf(value) else value)
        node = value
    return line


def _is_leaf(node: yaml.Node) -> bool:
    return isinstance(node, yaml.ScalarNode)


def _recipe_error(exc: ValidationError, root: yaml.Node, file: str) -> RecipeError:
    # a misspelt key shows as an unknown key plus a missing one: the unknown key is the cause, report it first
    errors = sorted(exc.errors(), key=lambda error: error["type"] != "extra_forbidden")
    first = errors[0]
    loc: Loc = tuple(part for part in first["loc"] if not (isinstance(part, str) and "[" in part))
    message = first["msg"]
    cause = (first.get("ctx") or {}).get("error")
    if isinstance(cause, StepError):
        loc = ("variants", cause.variant, cause.index, *cause.loc)
        message = cause.message
    elif message.startswith("Value error, "):
        message = message[len("Value error, "):]
    if first["type"] == "extra_forbidden":
        missing = [str(e["loc"][-1]) for e in errors if e["type"] == "missing" and e["loc"][:-1] == loc[:-1]]
        close = difflib.get_close_matches(str(loc[-1]), missing, n=1)
        hint = f"did you mean '{close[0]}'?" if close else "check its spelling against `qdeploy schema`"
        message = f"unknown field '{loc[-1]}'; {hint}"
    elif first["type"] == "missing":
        message = f"required field '{loc[-1]}' is missing"
    more = len(errors) - 1
    if more:
        message += f" (and {more} more problem{'s' if more > 1 else ''})"
    field = ".".join(str(part) for part in loc) or None
    return RecipeError(message, file=file, line=node_line(root, loc), field=field)


def _check_paths(recipe: Recipe, root: yaml.Node, file: str) -> None:
    checks: list[tuple[Loc, str | None]] = [(("model", "onnx"), recipe.model.onnx)]
    if recipe.model.torch is not None:
        checks.append((("model", "torch", "weights"), recipe.model.torch.weights))
        factory_file = recipe.model.torch.factory.rsplit(":", 1)[0]
        if factory_file.endswith(".py"):
            checks.append((("model", "torch", "factory"), factory_file))
    for name, spec in recipe.data.items():
        checks.append((("data", name, "path"), spec.path))
    checks.append((("validate", "reference_model"), recipe.validate_.reference_model))
    metric_file = (recipe.validate_.metric or "").rsplit(":", 1)[0]
    if metric_file.endswith(".py"):
        checks.append((("validate", "metric"), metric_file))
    for loc, value in checks:
        if value is not None and not recipe.resolve(value).exists():
            raise RecipeError(f"path '{value}' does not exist (resolved to {recipe.resolve(value)})",
                              file=file, line=node_line(root, loc), field=".".join(map(str, loc)))
    _check_stage_configs(recipe, root, file)


def _check_stage_configs(recipe: Recipe, root: yaml.Node, file: str) -> None:
    """Checks a stage can make of its own section before anything runs (no user code is executed)."""
    from stages.validate import check_config

    try:
        check_config(recipe.validate_, recipe)
    except RecipeError as exc:
        field = exc.field or "validate"
        raise RecipeError(exc.detail, file=file, line=node_line(root, tuple(field.split("."))), field=field) from None


def recipe_python_references(recipe: Recipe) -> list[dict[str, Any]]:
    """Python code a recipe will execute (factories, metrics): `qdeploy check` lists them."""
    refs = []
    if recipe.model.torch is not None:
        refs.append({"field": "model.torch.factory", "code": recipe.model.torch.factory})
    metric = getattr(recipe.validate_, "metric", None)
    if metric:
        refs.append({"field": "validate.metric", "code": metric})
    return refs
