"""Where the validate stage's reference outputs come from: a variant, or ``validate.reference_model``.

A reference model (converted elsewhere, say the original a vendor's model was
made from) must take the same inputs and give the same outputs as the
artifacts: names, element kinds (float / integer / bool) and every dimension
both sides fix.  A mismatch is a ``RecipeError`` naming both sides.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from qdeploy.core.compare import as_array
from qdeploy.core.errors import ModelError, RecipeError
from qdeploy.core.onnx_wire import load_model
from qdeploy.graph.utils import graph_inputs

if TYPE_CHECKING:
    import onnx

    from qdeploy.core.context import Artifact, StageContext
    from qdeploy.stages.validate._common import Outputs
    from qdeploy.stages.validate.config import ValidateConfig

_FIELD = "validate.reference_model"


class ReferenceMissing(Exception):
    """The reference variant was not built: every row is an error saying so."""


@dataclass
class ReferenceSource:
    """The model whose ort:cpu outputs every pair is compared with."""

    label: str
    """How the report names it: "variant 'fp32'" or "reference_model 'orig.onnx'"."""
    path: Path
    variant: str | None
    """The variant it is, or None for a reference_model."""
    feed_model: Path
    """The model that random feeds are shaped from (an artifact where there is one)."""

    def check_outputs(self, reference_outputs: Outputs, config: ValidateConfig) -> None:
        """validate.outputs may only name outputs the reference has."""
        names = list(reference_outputs[0]) if reference_outputs else []
        unknown = [name for name in config.outputs if names and name not in names]
        if unknown:
            raise RecipeError(f"names outputs {unknown}; the reference {self.label} has outputs {names}",
                              field="validate.outputs")


def unvarying_outputs(reference_outputs: Outputs, label: str) -> list[str]:
    """Warnings for the reference's float outputs that are zero everywhere, or the same on every sample: a
    comparison with such an output passes a wrong artifact as readily as a right one (a freshly initialised
    classifier head gives zeros; an output the data does not reach gives one value)."""
    found = []
    for name in reference_outputs[0] if reference_outputs else {}:
        try:
            first = as_array(reference_outputs[0][name])
            if not np.issubdtype(first.dtype, np.floating) or first.size == 0:
                continue
            same = all(np.array_equal(as_array(sample[name]), first) for sample in reference_outputs[1:])
        except Exception:  # a sequence of maps, a missing sample: the comparison itself reports those
            continue
        if same and not first.any():
            what = f"zero everywhere on {'every one' if len(reference_outputs) > 1 else 'the one'} of the " \
                   f"{len(reference_outputs)} sample(s)"
        elif same and len(reference_outputs) > 1:
            what = f"the same on all {len(reference_outputs)} samples"
        else:
            continue
        found.append(f"reference {label}: output '{name}' is {what}: comparing with it cannot tell a wrong artifact "
                     "from a right one; validate on data where it varies (a freshly initialised head gives zeros)")
    return found


def reference_source(artifacts: dict[str, Artifact], config: ValidateConfig, ctx: StageContext) -> ReferenceSource:
    """The reference of this run; ReferenceMissing when its variant was not built, RecipeError when it is unfit."""
    variant = ctx.reference_variant
    built = artifacts.get(variant)
    if config.reference_model is None:
        if built is None:
            raise ReferenceMissing(f"reference variant '{variant}' was not built; nothing to compare with")
        return ReferenceSource(f"variant '{variant}'", built.path, variant, built.path)
    path = ctx.resolve(config.reference_model)
    if not path.is_file():
        raise RecipeError(f"file '{config.reference_model}' does not exist (resolved to {path})", field=_FIELD)
    feed_model = built.path if built is not None else next((a.path for a in artifacts.values()), path)
    if feed_model != path:
        check_compatible(path, feed_model)
    return ReferenceSource(f"reference_model '{config.reference_model}'", path, None, feed_model)


def check_compatible(reference: Path, artifact: Path) -> None:
    """The reference model's inputs and outputs match the artifact's, or a RecipeError says how they differ."""
    ref_inputs, ref_outputs = _signature(reference)
    art_inputs, art_outputs = _signature(artifact)
    problems = []
    if set(ref_inputs) != set(art_inputs):
        problems.append(f"inputs {sorted(ref_inputs)} vs the artifact's {sorted(art_inputs)}")
    if set(ref_outputs) != set(art_outputs):
        problems.append(f"outputs {sorted(ref_outputs)} vs the artifact's {sorted(art_outputs)}")
    for kind, ref_side, art_side in (("input", ref_inputs, art_inputs), ("output", ref_outputs, art_outputs)):
        for name in sorted(set(ref_side) & set(art_side)):
            problem = _value_mismatch(ref_side[name], art_side[name])
            if problem:
                problems.append(f"{kind} '{name}': {problem}")
    if problems:
        raise RecipeError(f"{reference.name} does not match the artifacts it should serve as reference for: "
                          f"{'; '.join(problems)}", field=_FIELD)


Signature = dict[str, tuple[str, tuple[int | None, ...] | None]]


def _signature(path: Path) -> tuple[Signature, Signature]:
    """(inputs, outputs): name -> (element kind, dims or None when unknown); initializers are no inputs."""

    try:
        model = load_model(path, load_external_data=False)
    except Exception as exc:
        raise ModelError(f"{path.name}: not a readable ONNX model: {' '.join(str(exc).split())[:300]}") from None
    inputs = {value.name: _describe(value) for value in graph_inputs(model.graph)}
    return inputs, {value.name: _describe(value) for value in model.graph.output}


def _describe(value: onnx.ValueInfoProto) -> tuple[str, tuple[int | None, ...] | None]:
    from onnx import helper

    tensor = value.type.tensor_type
    try:
        kind = np.dtype(helper.tensor_dtype_to_np_dtype(tensor.elem_type)).kind
    except Exception:  # unknown element type: let the runtime decide
        kind = "?"
    name = {"f": "float", "i": "integer", "u": "integer", "b": "bool"}.get(kind, "other")
    if not tensor.HasField("shape"):
        return name, None
    return name, tuple(d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else None for d in tensor.shape.dim)


def _value_mismatch(reference: tuple[str, tuple[int | None, ...] | None],
                    artifact: tuple[str, tuple[int | None, ...] | None]) -> str:
    (ref_kind, ref_dims), (art_kind, art_dims) = reference, artifact
    if "other" not in (ref_kind, art_kind) and ref_kind != art_kind:
        return f"{ref_kind} in the reference, {art_kind} in the artifact"
    if ref_dims is None or art_dims is None:
        return ""
    fixed_differ = len(ref_dims) == len(art_dims) and any(
        r is not None and a is not None and r != a for r, a in zip(ref_dims, art_dims, strict=True))
    if len(ref_dims) != len(art_dims) or fixed_differ:
        shown = [["?" if d is None else d for d in dims] for dims in (ref_dims, art_dims)]
        return f"shape {shown[0]} in the reference, {shown[1]} in the artifact"
    return ""
