"""Output shapes re-derived after the recipe overrides input shapes.

A model exported at batch 1 declares its outputs at batch 1 (``logits [1, 10]``).  When ``model.inputs``
makes the batch symbolic (``[batch, 3, 64, 64]``), the old output declaration is stale: ONNX Runtime
enforces declared static output dimensions at run time ("Got invalid dimensions for output") and every
later stage that merges inferred shapes into declared ones keeps the stale ``1``.  So the declared output
shapes are dropped with the input change and inferred again from the new inputs.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import onnx

    from qdeploy.stages.export.findings import ShapeChangeRecord

log = logging.getLogger(__name__)

Dims = list[int | str | None]


def declared_dims(value: onnx.ValueInfoProto) -> Dims | None:
    """A value's declared dimensions (int, symbol name, or None for an anonymous one); None when rank is unknown."""
    tensor_type = value.type.tensor_type
    if not value.type.HasField("tensor_type") or not tensor_type.HasField("shape"):
        return None
    return [dim.dim_value if dim.HasField("dim_value") else (dim.dim_param or None) for dim in tensor_type.shape.dim]


def reinfer_output_shapes(model: onnx.ModelProto) -> dict[str, ShapeChangeRecord]:
    """Drop the graph outputs' declared shapes and the inferred value_info, and infer them from the inputs again.

    Returns, per output whose declaration changed, the declared and the new dimensions.  Where inference
    cannot tell (a model too large for an in-memory pass, an op onnx does not know, a shape computed at run
    time), an output keeps its declared rank and symbolic names, and its fixed sizes become unknown: possibly
    stale, they are not kept (the checker wants a shape on a graph output once it had one).
    """
    before = {value.name: declared_dims(value) for value in model.graph.output}
    for value in model.graph.output:
        if value.type.HasField("tensor_type"):
            value.type.tensor_type.ClearField("shape")
    del model.graph.value_info[:]
    inferred = _inferred_outputs(model)
    changed: dict[str, ShapeChangeRecord] = {}
    for value in model.graph.output:
        new = inferred.get(value.name)
        if new is not None and new.type.tensor_type.HasField("shape"):
            value.type.tensor_type.shape.CopyFrom(new.type.tensor_type.shape)
        elif before[value.name] is not None:
            _unknown_sizes(value, before[value.name])
        after = declared_dims(value)
        if after != before[value.name]:
            changed[value.name] = {"declared": before[value.name], "now": after}
    if changed:
        log.info("output shapes re-inferred after the input overrides: %s", changed)
    return changed


def _unknown_sizes(value: onnx.ValueInfoProto, declared: Dims) -> None:
    shape = value.type.tensor_type.shape
    for dim in declared:
        entry = shape.dim.add()
        if isinstance(dim, str):
            entry.dim_param = dim


def _inferred_outputs(model: onnx.ModelProto) -> dict[str, onnx.ValueInfoProto]:
    import onnx

    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False, data_prop=True)
    except (onnx.shape_inference.InferenceError, ValueError, RuntimeError) as exc:
        log.warning("output shapes unknown after the input overrides: shape inference failed: %s", exc)
        return {}
    return {value.name: value for value in inferred.graph.output}
