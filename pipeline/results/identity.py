"""What a report is about: the model, the recipe and the environment, recorded so that two reports can be
told apart (``qdeploy compare`` refuses a model it cannot match and names every other difference)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

from qdeploy.core.context import Artifact
from qdeploy.core.errors import RecipeError
from qdeploy.core.files import sha256_file
from qdeploy.core.onnx_wire import load_model
from qdeploy.core.stage_config import StageConfig
from qdeploy.graph.utils import graph_inputs
from qdeploy.pipeline.recipe.text_data import causal_lm_checkpoint, with_model_tokenizer

if TYPE_CHECKING:
    from qdeploy.pipeline.recipe.schema import Recipe

__all__ = ["ENVIRONMENT_FIELDS", "RECIPE_SECTIONS", "CodeFingerprintDict", "DatasetFingerprintDict",
           "ExternalFileDict", "ModelIdentityDict", "ModelSignatureDict", "TensorSignatureDict", "code_fingerprint",
           "comparison_facts",
           "dataset_fingerprint", "model_identity", "model_mismatch", "model_signature", "recipe_content",
           "recipe_content_note", "recipe_fingerprint", "run_differences"]

RECIPE_SECTIONS = ("model", "data", "variants", "targets", "validate", "benchmark", "gates")
ENVIRONMENT_FIELDS = (("cpu", "model"), ("cpu", "cores"), ("cpu", "flags"), ("python",), ("platform",))


class DatasetFingerprintDict(TypedDict):
    """One dataset in a cache key: its spec as the recipe's model dumps it, and (name, sha256) per file."""

    spec: dict[str, Any]
    files: list[tuple[str, str]]


class CodeFingerprintDict(TypedDict, total=False):
    """The user code a stage's config names, by content (empty when it names none): per field, the file's sha256
    and the function, or the 'package.module:function' it names."""

    code: dict[str, str | list[Any]]


class TensorSignatureDict(TypedDict):
    """One model input or output (``qdeploy.core.report_parts.TensorSignature`` reads it)."""

    name: str
    type: str
    shape: list[int | str] | None


class ModelSignatureDict(TypedDict):
    inputs: list[TensorSignatureDict]
    outputs: list[TensorSignatureDict]


class ExternalFileDict(TypedDict):
    file: str
    sha256: str


class ModelIdentityDict(ModelSignatureDict):
    """report.json's ``model`` as the run writes it (``qdeploy.core.report_parts.ModelIdentity`` reads it)."""

    exported_sha256: str
    exported_key: str
    external_data: list[ExternalFileDict]


def dataset_fingerprint(recipe: Recipe, datasets: list[str]) -> dict[str, DatasetFingerprintDict]:
    """What a stage's datasets are, for its cache key: their spec and, for folders, each file's name and the
    sha256 of its content.  Never size and mtime: samples rewritten with other values but the same size and
    mtime would reuse an artifact calibrated on the old ones."""
    fingerprint: dict[str, DatasetFingerprintDict] = {}
    read_as = with_model_tokenizer({name: recipe.data[name] for name in datasets}, recipe.model, recipe.resolve)
    for name in datasets:
        spec = recipe.data[name]
        files: list[tuple[str, str]] = []
        if spec.path:
            folder = recipe.resolve(spec.path)
            files = sorted((p.name, _content_sha256(p)) for p in folder.iterdir() if p.is_file()) \
                if folder.is_dir() else []
        if spec.reader == "text":  # one file, and the tokenizer that cuts it (the model's when it names none)
            files = _text_files(recipe, spec.path or "", read_as[name].tokenizer or "")
        fingerprint[name] = {"spec": spec.model_dump(mode="json"), "files": files}
    return fingerprint


_WEIGHT_SUFFIXES = frozenset({".safetensors", ".bin", ".pt", ".pth", ".onnx", ".h5", ".msgpack", ".ckpt"})
"""Files of a transformers folder that hold weights, not the tokenizer: left out of a text dataset's identity
(a checkpoint folder serving as the tokenizer would be hashed whole for every stage's key)."""


def _text_files(recipe: Recipe, text: str, tokenizer: str) -> list[tuple[str, str]]:
    """(name, sha256) of a text dataset's file and of its tokenizer's files (a folder's but its weights)."""
    files = [(Path(text).name, _sha_or_note(recipe.resolve(text)))]
    if tokenizer:
        place = recipe.resolve(tokenizer)
        members = sorted(item for item in place.iterdir() if item.is_file() and item.suffix not in _WEIGHT_SUFFIXES) \
            if place.is_dir() else [place]
        files += [(f"tokenizer/{item.name}", _sha_or_note(item)) for item in members]
    return files


def _sha_or_note(path: Path) -> str:
    try:
        return _content_sha256(path)
    except OSError:  # gone since the recipe was loaded: the reader will say so
        return f"unreadable {path}"


_HASHED: dict[tuple[str, int, int, int, int], str] = {}
"""sha256 of files already read in this process, by (path, inode, size, mtime, ctime): a run's stage keys hash a
GGUF tokenizer (about 100 MB) once, not once per step.  The change time is the system's (no tool sets it), so a
file rewritten in place, however its size and mtime are made to look, is read again."""


def _content_sha256(path: Path) -> str:
    status = path.stat()
    key = (str(path.resolve()), status.st_ino, status.st_size, status.st_mtime_ns, status.st_ctime_ns)
    if key not in _HASHED:
        _HASHED[key] = sha256_file(path)
    return _HASHED[key]


def code_fingerprint(recipe: Recipe, config: StageConfig) -> CodeFingerprintDict:
    """The user code a stage's config names (a budget's task metric, ``tolerance.metric``) by content, for its
    cache key: an edited metrics.py rebuilds the artifact its budget chose.  Empty when the config names none, so
    every other key stays what it was."""
    budget = config.task_budget()
    if budget is None or budget.metric is None:
        return {}
    return {"code": {"tolerance.metric": _content_of(recipe, budget.metric, code=True)}}


def comparison_facts(recipe: Recipe, uses_targets: bool, true_fp16: bool) -> dict[str, Any]:
    """What a stage that measures its own artifact (an accuracy budget) depends on beyond its config, for its cache
    key: the targets it confirms on and the detections it matches (``validate.detections``, only when set, so
    every other key stays what it was)."""
    if not uses_targets:
        return {}
    facts: dict[str, Any] = {"targets": sorted(recipe.validated_targets(true_fp16=true_fp16))}
    if (detections := recipe.validate_.detection_spec()) is not None:
        facts["detections"] = detections
    return facts


def model_identity(exported: Artifact) -> ModelIdentityDict:
    """What a run's model is (its exported artifact), so `qdeploy compare` can tell two runs of different models
    apart."""
    return {"exported_sha256": exported.sha256, "exported_key": exported.key,
            "external_data": [{"file": name, "sha256": digest} for name, digest, _ in exported.external_data],
            **model_signature(exported.path)}


def model_signature(path: Path) -> ModelSignatureDict:
    """Inputs and outputs of a model (name, element type, shape with symbolic dimensions as names)."""

    model = load_model(path, load_external_data=False)
    return {"inputs": [_value_info(v) for v in graph_inputs(model.graph)],
            "outputs": [_value_info(v) for v in model.graph.output]}


def _value_info(value: Any) -> TensorSignatureDict:
    import onnx

    tensor = value.type.tensor_type
    if not value.type.HasField("tensor_type"):
        return {"name": value.name, "type": value.type.WhichOneof("value") or "unknown", "shape": None}
    shape = None
    if tensor.HasField("shape"):
        shape = [d.dim_value if d.HasField("dim_value") else (d.dim_param or "?") for d in tensor.shape.dim]
    return {"name": value.name, "type": onnx.TensorProto.DataType.Name(tensor.elem_type).lower(), "shape": shape}


def recipe_fingerprint(recipe: Recipe) -> dict[str, str]:
    """A short hash of each section of the validated recipe, so a comparison can say which section differs."""
    dumped = recipe.model_dump(mode="json", by_alias=True)
    return {section: _digest(dumped.get(section)) for section in RECIPE_SECTIONS}


def recipe_content(recipe: Recipe) -> dict[str, str]:
    """A short hash of each section that names files (model, data, validate), with every path replaced by what
    it points at: a file's sha256, a folder's file names and sha256s.  Paths are written relative to the
    recipe, so their text says nothing of the files: a recipe moved to another folder that reads the same
    files has the same content, and one whose files changed under the same path text has not."""
    dumped = recipe.model_dump(mode="json", by_alias=True)
    for loc, value in _path_fields(recipe):
        section = dumped
        for key in loc[:-1]:
            section = section[key]
        section[loc[-1]] = _content_of(recipe, value, code=loc[-1] in ("factory", "metric"))
    return {section: _digest(dumped.get(section)) for section in _CONTENT_SECTIONS}


_CONTENT_SECTIONS = ("model", "data", "validate")
"""The recipe sections whose fields name files (the loader checks the same fields, pipeline/recipe/loader.py)."""


def _path_fields(recipe: Recipe) -> list[tuple[tuple[Any, ...], str]]:
    model, validate = recipe.model, recipe.validate_
    fields: list[tuple[tuple[Any, ...], Any]] = [(("model", "onnx"), model.onnx)]
    if model.torch is not None:
        fields += [(("model", "torch", "factory"), model.torch.factory),
                   (("model", "torch", "weights"), model.torch.weights)]
    fields += [(("model", "inputs", index, "value"), spec.value) for index, spec in enumerate(model.inputs)]
    if model.causal_lm is not None:
        fields.append(_checkpoint_field(recipe))
    fields += [(("data", name, "path"), spec.path) for name, spec in recipe.data.items()]
    fields += [(("data", name, "tokenizer"), spec.tokenizer) for name, spec in recipe.data.items()]
    fields += [(("validate", "reference_model"), validate.reference_model), (("validate", "metric"), validate.metric)]
    return [(loc, value) for loc, value in fields if isinstance(value, str)]  # a frozen number is no path


def _checkpoint_field(recipe: Recipe) -> tuple[tuple[Any, ...], Any]:
    """model.causal_lm's checkpoint as a path: its own 'path', or where 'package' and 'file' find it (its text
    when the package is gone)."""
    source = recipe.model.causal_lm
    assert source is not None
    if source.path is not None:
        return ("model", "causal_lm", "path"), source.path
    try:
        found = causal_lm_checkpoint(recipe.model, recipe.resolve)
    except RecipeError:
        return ("model", "causal_lm", "file"), None  # the package is gone: its name and file stay as written
    return ("model", "causal_lm", "file"), str(found)


def _content_of(recipe: Recipe, value: str, *, code: bool) -> Any:
    """What a recipe path points at; 'file.py:function' keeps its function, 'package.module:function' is its
    own identity (an installed package is not the recipe's to hash)."""
    if code:
        module, _, function = value.rpartition(":")
        return [_content_of(recipe, module, code=False), function] if module.endswith(".py") else value
    path = recipe.resolve(value)
    try:
        if path.is_dir():
            return sorted((item.name, sha256_file(item)) for item in path.iterdir() if item.is_file())
        return sha256_file(path)
    except OSError:  # gone or unreadable since the run read it: its place is all that can be said
        return f"unreadable {path}"


def recipe_content_note(before: dict[str, Any], after: dict[str, Any]) -> str:
    """Why the recipes' files were compared by their path text ('' when both reports record their content)."""
    recipes = [report.get("recipe") or {} for report in (before, after)]
    if not all(isinstance(recipe.get("sections"), dict) for recipe in recipes):
        return ""  # no recipe record at all: run_differences() says so
    older = [label for label, recipe in zip("AB", recipes, strict=True) if not isinstance(recipe.get("content"), dict)]
    if not older:
        return ""
    which = "report A does" if older == ["A"] else "report B does" if older == ["B"] else "neither report does"
    return (f"{which} not record what its recipe's paths point at (written by an older qdeploy): model, data "
            "and validate are compared by their path text, so a moved recipe shows as differing in them")


def _digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:16]


def model_mismatch(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    """Why the two reports are not about the same model (inputs or outputs differ); empty when they may be."""
    a, b = before.get("model"), after.get("model")
    if not isinstance(a, dict) or not isinstance(b, dict):
        return []
    reasons = []
    for side in ("inputs", "outputs"):
        if a.get(side) != b.get(side):
            reasons.append(f"model {side} differ: {_names(a.get(side))} vs {_names(b.get(side))}")
    return reasons


def _names(values: Any) -> str:
    if not isinstance(values, list):
        return "unknown"
    return "[" + ", ".join(f"{v.get('name')} {v.get('type')} {v.get('shape')}" for v in values
                           if isinstance(v, dict)) + "]"


def run_differences(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    """Every difference of model, recipe and environment that makes the two runs less than comparable."""
    notes = []
    a_model, b_model = before.get("model"), after.get("model")
    if not isinstance(a_model, dict) or not isinstance(b_model, dict):
        notes.append("a report does not record its model (written by an older qdeploy): cannot tell whether "
                     "both runs are of the same model")
    elif a_model.get("exported_sha256") != b_model.get("exported_sha256"):
        notes.append(f"model differs: exported sha256 {str(a_model.get('exported_sha256'))[:12]}… vs "
                     f"{str(b_model.get('exported_sha256'))[:12]}…")
    notes += _recipe_differences(before.get("recipe") or {}, after.get("recipe") or {})
    notes += _environment_differences(before.get("environment") or {}, after.get("environment") or {})
    return notes


def _recipe_differences(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    notes = []
    if a.get("name") != b.get("name"):
        notes.append(f"recipe name differs: {a.get('name')!r} vs {b.get('name')!r}")
    sections_a, sections_b = a.get("sections"), b.get("sections")
    if isinstance(sections_a, dict) and isinstance(sections_b, dict):
        content_a, content_b = a.get("content"), b.get("content")
        if isinstance(content_a, dict) and isinstance(content_b, dict):  # by what paths point at, not their text
            sections_a, sections_b = {**sections_a, **content_a}, {**sections_b, **content_b}
        changed = [name for name in RECIPE_SECTIONS if sections_a.get(name) != sections_b.get(name)]
        if changed:
            notes.append(f"recipe differs in: {', '.join(changed)}")
    elif sections_a != sections_b:
        notes.append("a report does not record its recipe's content: cannot tell whether the recipes agree")
    return notes


def _environment_differences(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    notes = []
    for path in ENVIRONMENT_FIELDS:
        value_a, value_b = _lookup(a, path), _lookup(b, path)
        if value_a != value_b:
            notes.append(f"environment differs: {'.'.join(path)} {_brief(value_a)} vs {_brief(value_b)}")
    versions_a, versions_b = a.get("versions") or {}, b.get("versions") or {}
    changed = sorted(name for name in versions_a.keys() | versions_b.keys()
                     if versions_a.get(name) != versions_b.get(name))
    if changed:
        notes.append("environment differs: " + ", ".join(
            f"{name} {versions_a.get(name, 'absent')} vs {versions_b.get(name, 'absent')}" for name in changed))
    return notes


def _lookup(data: dict[str, Any], path: tuple[str, ...]) -> Any:
    value: Any = data
    for key in path:
        value = value.get(key) if isinstance(value, dict) else None
    return value


def _brief(value: Any) -> str:
    if isinstance(value, dict):
        return "{" + ", ".join(key for key, present in value.items() if present) + "}"
    return repr(value)
