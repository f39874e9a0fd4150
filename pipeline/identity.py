"""What a report is about: the model, the recipe and the environment, recorded so that two reports can be
told apart (``qdeploy compare`` refuses a model it cannot match and names every other difference)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from qdeploy.core.files import sha256_file
from qdeploy.core.onnx_wire import load_model
from qdeploy.graph.utils import graph_inputs

if TYPE_CHECKING:
    from qdeploy.pipeline.recipe import Recipe

__all__ = ["ENVIRONMENT_FIELDS", "RECIPE_SECTIONS", "dataset_fingerprint", "differences", "model_mismatch",
           "model_signature", "recipe_fingerprint"]

RECIPE_SECTIONS = ("model", "data", "variants", "targets", "validate", "benchmark", "gates")
ENVIRONMENT_FIELDS = (("cpu", "model"), ("cpu", "cores"), ("cpu", "flags"), ("python",), ("platform",))


def dataset_fingerprint(recipe: Recipe, datasets: list[str]) -> dict[str, Any]:
    """What a stage's datasets are, for its cache key: their spec and, for folders, each file's name and the
    sha256 of its content.  Never size and mtime: samples rewritten with other values but the same size and
    mtime would reuse an artifact calibrated on the old ones."""
    fingerprint: dict[str, Any] = {}
    for name in datasets:
        spec = recipe.data[name]
        files: list[Any] = []
        if spec.path:
            folder = recipe.resolve(spec.path)
            files = sorted((p.name, sha256_file(p)) for p in folder.iterdir() if p.is_file()) \
                if folder.is_dir() else []
        fingerprint[name] = {"spec": spec.model_dump(mode="json"), "files": files}
    return fingerprint


def model_signature(path: Path) -> dict[str, Any]:
    """Inputs and outputs of a model (name, element type, shape with symbolic dimensions as names)."""

    model = load_model(path, load_external_data=False)
    return {"inputs": [_value_info(v) for v in graph_inputs(model.graph)],
            "outputs": [_value_info(v) for v in model.graph.output]}


def _value_info(value: Any) -> dict[str, Any]:
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


def differences(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
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
