"""Load a recipe file: YAML with line numbers in every error."""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypedDict

import yaml
from pydantic import ValidationError

from qdeploy.calibration.images import is_image
from qdeploy.calibration.readers import is_npy_sample
from qdeploy.core.context import StageContext
from qdeploy.core.errors import RecipeError, UserFileError
from qdeploy.core.lm_metrics import builtin_metric
from qdeploy.core.tolerance import TOLERANCE_TAGS
from qdeploy.core.userfiles import check_regular_file, files_in_folder, read_text
from qdeploy.pipeline.recipe.schema import Recipe, StepError
from qdeploy.stages.export import check_factory, source_files
from qdeploy.stages.validate import check_config

__all__ = ["MAX_RECIPE_BYTES", "MAX_YAML_DEPTH", "MAX_YAML_VALUES", "Loc", "PythonCodeReference", "RecipeLoader",
           "check_recipe_files", "document_loc", "load_recipe_file", "node_line", "parse_recipe", "parse_yaml",
           "read_yaml_text", "recipe_python_references"]

Loc = tuple[str | int, ...]


class PythonCodeReference(TypedDict):
    """Python code a recipe executes: the recipe field that names it, and the code as written there."""

    field: str
    code: str


MAX_RECIPE_BYTES = 1_000_000
"""Largest recipe or sweep file: real ones are a few kilobytes; YAML parses at about 1 MB/s."""
MAX_YAML_VALUES = 100_000
"""Most values a recipe may hold once its aliases are expanded (a 'billion laughs' bomb expands exponentially)."""
MAX_YAML_DEPTH = 64
"""Deepest nesting of lists and mappings."""
_BOOL_TAG = "tag:yaml.org,2002:bool"


class RecipeLoader(yaml.SafeLoader):
    """PyYAML's safe loader with YAML 1.2's booleans: only true and false.  YAML 1.1 also reads bare on, off, yes,
    no as booleans, so ``report: {layers: off}`` (as the docs write it, and as an editor's YAML 1.2 schema reads
    it) reached the recipe as False; here such words stay text, and a boolean field still takes them (pydantic
    reads 'off' and 'no' as false, 'on' and 'yes' as true)."""


RecipeLoader.yaml_implicit_resolvers = {
    first: [(tag, pattern) for tag, pattern in resolvers if tag != _BOOL_TAG]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()}
RecipeLoader.add_implicit_resolver(_BOOL_TAG, re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF"))


def load_recipe_file(path: str | Path) -> Recipe:
    """Parse and validate a recipe file; RecipeError names the file, line and field on any problem."""
    path = Path(path)
    return parse_recipe(read_yaml_text(path, "recipe"), source=path)


def read_yaml_text(path: Path, what: str) -> str:
    """The text of a recipe or sweep file: a regular UTF-8 file of at most MAX_RECIPE_BYTES, refused otherwise."""
    try:
        return read_text(path, f"{what} file", max_bytes=MAX_RECIPE_BYTES)
    except UserFileError as exc:
        message = f"{what} file not found" if exc.problem == "does not exist" else f"the {what} file {exc.problem}"
        raise RecipeError(message, file=str(path)) from None


def parse_recipe(text: str, *, source: Path | None = None) -> Recipe:
    """Validate recipe text; ``source`` anchors relative paths and error messages."""
    file = str(source) if source else "<recipe>"
    root, data = parse_yaml(text, file)
    if not isinstance(root, yaml.MappingNode):
        raise RecipeError("a recipe is a YAML mapping (name, model, variants, ...)", file=file, line=_line(root))
    _refuse_duplicate_keys(root, file)
    try:
        recipe = Recipe.model_validate(data)
    except ValidationError as exc:
        raise _recipe_error(exc, root, file) from None
    recipe._source = source.resolve() if source else None
    check_recipe_files(recipe, root, file)
    return recipe


def parse_yaml(text: str, file: str) -> tuple[yaml.Node | None, Any]:
    """YAML text as its node tree and its plain values; RecipeError for text too large, too deep, alias bombs,
    recursive aliases and tags that are not plain data (such as !!python/object/apply)."""
    if len(text) > MAX_RECIPE_BYTES:
        raise RecipeError(f"the text is {len(text) / 1e6:.1f} MB; a recipe may be at most "
                          f"{MAX_RECIPE_BYTES / 1e6:.0f} MB", file=file)
    root = _compose(text, file)
    if root is None:
        return None, None
    _check_expansion(root, file)
    return root, _construct(root, file)


def _compose(text: str, file: str) -> yaml.Node | None:
    try:
        return yaml.compose(text, Loader=RecipeLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark else None
        raise RecipeError(f"YAML syntax error: {exc.problem or exc}", file=file, line=line) from None
    except yaml.YAMLError as exc:
        raise RecipeError(f"YAML error: {exc}", file=file) from None
    except RecursionError:
        raise RecipeError(f"values nest more than {MAX_YAML_DEPTH} levels deep", file=file) from None


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    return []


def _check_expansion(root: yaml.Node, file: str) -> None:
    """Count the values the document holds with its aliases expanded, visiting each node once."""
    expanded: dict[int, int] = {}
    open_nodes: set[int] = set()

    def count(node: yaml.Node, depth: int) -> int:
        if id(node) in expanded:
            return expanded[id(node)]
        if id(node) in open_nodes:
            raise RecipeError("an alias refers to a value that contains it (a recursive alias); write the value "
                              "out", file=file, line=_line(node))
        if depth > MAX_YAML_DEPTH:
            raise RecipeError(f"values nest more than {MAX_YAML_DEPTH} levels deep", file=file, line=_line(node))
        open_nodes.add(id(node))
        total = 1
        for child in _children(node):
            total += count(child, depth + 1)
            if total > MAX_YAML_VALUES:
                raise RecipeError(f"aliases expand the recipe past {MAX_YAML_VALUES} values (an alias bomb?); "
                                  "use fewer nested aliases", file=file, line=_line(node))
        open_nodes.discard(id(node))
        expanded[id(node)] = total
        return total

    count(root, 0)


def _construct(root: yaml.Node, file: str) -> Any:
    """Plain Python values of a composed document; only YAML's safe tags construct anything."""
    loader = RecipeLoader("")
    try:
        return loader.construct_document(root)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        hint = "; a recipe holds plain values (text, numbers, lists, mappings)" if "tag" in str(exc.problem) else ""
        raise RecipeError(f"YAML error: {exc.problem}{hint}", file=file, line=mark.line + 1 if mark else None) from None
    except (yaml.YAMLError, ValueError, TypeError, OverflowError) as exc:  # e.g. `!!int abc`
        raise RecipeError(f"YAML value cannot be read: {exc}", file=file) from None
    finally:
        loader.dispose()


def _line(node: yaml.Node | None) -> int | None:
    return node.start_mark.line + 1 if node is not None else None


def _refuse_duplicate_keys(root: yaml.Node, file: str) -> None:
    """Each mapping's keys once; every node is visited once, so shared (aliased) nodes cost nothing more."""
    seen: set[int] = set()
    stack = [root]
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, yaml.MappingNode):
            first_line: dict[str, int | None] = {}
            for key, _ in node.value:
                name = str(key.value)
                if name in first_line:
                    raise RecipeError(f"key '{name}' repeats (first at line {first_line[name]}); each key may "
                                      "appear once", file=file, line=_line(key))
                first_line[name] = _line(key)
        stack.extend(reversed([value for _, value in node.value] if isinstance(node, yaml.MappingNode)
                              else _children(node)))


def _child(node: yaml.Node | None, key: str | int) -> tuple[yaml.Node | None, yaml.Node | None]:
    """(key node, value node) of a mapping key or sequence index; (None, None) when absent."""
    if isinstance(node, yaml.MappingNode):
        for key_node, value in node.value:
            if str(key_node.value) == str(key):
                return key_node, value
    if isinstance(node, yaml.SequenceNode) and isinstance(key, int) and 0 <= key < len(node.value):
        return node.value[key], node.value[key]
    return None, None


def node_line(root: yaml.Node | None, loc: Loc) -> int | None:
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


def document_loc(root: yaml.Node | None, loc: Loc) -> Loc:
    """``loc`` without pydantic's own steps (validator and union tags such as 'function-after[...]'): a step is
    kept when the document has it at that place, so a user's key may hold '[' too.  Past the document's end
    (a missing field), the rest is kept but for pydantic's tags."""
    kept: list[str | int] = []
    node: yaml.Node | None = root
    for index, part in enumerate(loc):
        _, value = _child(node, part)
        if value is not None:
            kept.append(part)
            node = value
        elif not _pydantic_tag(part) and (index == len(loc) - 1 or isinstance(node, yaml.MappingNode)):
            kept.append(part)  # the unknown or missing field itself, named by the user or by the schema
    return tuple(kept)


_PYDANTIC_TAG = re.compile(r"(?:function-\w+|tagged-union|lax-or-strict|json-or-python|nullable|list|dict|union|tuple"
                           r"|set)\[.*\]", re.DOTALL)
"""Steps pydantic puts into an error's location for its validators and unions, never keys of a document."""


def _pydantic_tag(part: str | int) -> bool:
    """A step of pydantic's own: a validator or union step, or the tag of a shape a discriminator chose."""
    return isinstance(part, str) and (_PYDANTIC_TAG.fullmatch(part) is not None or part in TOLERANCE_TAGS)


def _is_leaf(node: yaml.Node) -> bool:
    return isinstance(node, yaml.ScalarNode)


def _recipe_error(exc: ValidationError, root: yaml.Node, file: str) -> RecipeError:
    # a misspelt key shows as an unknown key plus a missing one: the unknown key is the cause, report it first
    errors = sorted(exc.errors(), key=lambda error: error["type"] != "extra_forbidden")
    first = errors[0]
    loc = document_loc(root, tuple(first["loc"]))
    message = first["msg"]
    cause = (first.get("ctx") or {}).get("error")
    if isinstance(cause, StepError):
        loc = document_loc(root, ("variants", cause.variant, cause.index, *cause.loc))
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


def check_recipe_files(recipe: Recipe, root: yaml.Node | None, file: str) -> None:
    """Every file the recipe names is a regular file (a text dataset's too), every data folder a folder of regular
    files inside it, a checkpoint or tokenizer a file or a folder, the factory defines its name; ``root`` (the
    recipe's YAML, None for a recipe made of a sweep's matrix) gives lines."""
    checks: list[tuple[Loc, str | None, str]] = [(("model", "onnx"), recipe.model.onnx, "model file")]
    if recipe.model.torch is not None:
        checks.append((("model", "torch", "weights"), recipe.model.torch.weights, "weights file"))
        factory_file = recipe.model.torch.factory.rsplit(":", 1)[0]
        if factory_file.endswith(".py"):
            checks.append((("model", "torch", "factory"), factory_file, "factory file"))
    if recipe.model.causal_lm is not None and recipe.model.causal_lm.path is not None:
        checks.append((("model", "causal_lm", "path"), recipe.model.causal_lm.path, "checkpoint"))
    checks += [(("model", "inputs", index, "value"), spec.value, f"value file of input '{spec.name}'")
               for index, spec in enumerate(recipe.model.inputs) if isinstance(spec.value, str)]
    checks.append((("validate", "reference_model"), recipe.validate_.reference_model, "reference model"))
    metric_file = (recipe.validate_.metric or "").rsplit(":", 1)[0]
    if metric_file.endswith(".py"):
        checks.append((("validate", "metric"), metric_file, "metric file"))
    for name, spec in recipe.data.items():
        if spec.reader == "text":  # one UTF-8 file, and its tokenizer: a file or a transformers folder
            checks.append((("data", name, "path"), spec.path, "text file"))
            checks.append((("data", name, "tokenizer"), spec.tokenizer, "tokenizer"))
    for loc, value, what in checks:
        if value is not None:
            _check_user_path(recipe, value, lambda path, what=what: _file_or_folder(path, what)
                             if what in _FILE_OR_FOLDER else check_regular_file(path, what), loc, root, file)
    for name, spec in recipe.data.items():
        if spec.path is not None and spec.reader != "text":
            wanted = is_image if spec.reader == "images" else is_npy_sample
            _check_user_path(recipe, spec.path, lambda path, name=name, wanted=wanted: files_in_folder(
                path, wanted, f"dataset '{name}'"), ("data", name, "path"), root, file)
    _check_stage_configs(recipe, root, file)


_FILE_OR_FOLDER = ("checkpoint", "tokenizer")
"""What a recipe may name as a file or a folder (a save_pretrained folder, or a .gguf or tokenizer.json file)."""


def _file_or_folder(path: Path, what: str) -> Path:
    """``path`` if it is a folder or a regular file; UserFileError otherwise (missing, a FIFO, a device)."""
    return path if path.is_dir() else check_regular_file(path, what)


def _check_user_path(recipe: Recipe, value: str, check: Callable[[Path], object], loc: Loc, root: yaml.Node | None,
                     file: str) -> None:
    path = recipe.resolve(value)
    try:
        check(path)
    except UserFileError as exc:
        # the named path itself, or a file in the named folder
        message = f"path '{value}' {exc.problem} (resolved to {path})" if exc.path == str(path) else str(exc)
        raise RecipeError(message, file=file, line=node_line(root, loc), field=".".join(map(str, loc))) from None


def _check_stage_configs(recipe: Recipe, root: yaml.Node | None, file: str) -> None:
    """Checks a stage can make of its own section before anything runs (no user code is executed)."""
    try:
        if recipe.model.torch is not None:  # parsed, never imported: `check` runs no user code
            check_factory(recipe.model.torch.factory, recipe.resolve)
        if recipe.model.causal_lm is not None:  # the checkpoint is there (its package found, never imported)
            source_files(recipe.model, StageContext(variant="export", work_dir=Path("."), resolver=recipe.resolve))
        check_config(recipe.validate_, recipe.resolve)
    except RecipeError as exc:
        field = exc.field or "validate"
        raise RecipeError(exc.detail, file=file, line=node_line(root, tuple(field.split("."))), field=field) from None


def recipe_python_references(recipe: Recipe) -> list[PythonCodeReference]:
    """Python code a recipe will execute (factories, metrics; qdeploy's built-in metrics are not the user's):
    `qdeploy check` lists them."""
    refs: list[PythonCodeReference] = []
    if recipe.model.torch is not None:
        refs.append({"field": "model.torch.factory", "code": recipe.model.torch.factory})
    if recipe.validate_.metric and builtin_metric(recipe.validate_.metric) is None:
        refs.append({"field": "validate.metric", "code": recipe.validate_.metric})
    for variant, steps in recipe.variants.items():  # an accuracy budget on a task metric calls its function too
        for step in steps:
            budget = step.config.task_budget()
            if budget is not None and budget.metric is not None and builtin_metric(budget.metric) is None:
                refs.append({"field": f"variants.{variant}.{step.stage}.tolerance.metric", "code": budget.metric})
    return refs
