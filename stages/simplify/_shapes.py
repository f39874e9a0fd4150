"""Shape inference for the simplify stage: into every graph's value_info (subgraphs too), by file for large models."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from qdeploy.core.values import one_line
from qdeploy.graph.light import light_bytes, light_copy, take_value_info
from qdeploy.graph.utils import prune_unproduced_value_info

if TYPE_CHECKING:
    import onnx

INFER_BY_PATH_BYTES = int(1.5 * 2**30)
"""Above this, shape inference goes through a file."""


def infer_shapes(model: onnx.ModelProto, work_dir: Path, stats: Any) -> onnx.ModelProto:
    """ONNX shape inference (strict off) into the model's value_info; through a file for large models.

    Inference runs on a light copy (large weights as tags: it reads their shapes, not their bytes) and only
    its value_info comes back, so the weights are never serialised.  On failure the model is unchanged.
    """
    import onnx


    prune_unproduced_value_info(model)
    stripped = light_copy(model, value_info=False)
    light = stripped.model
    if light_bytes(stripped) > INFER_BY_PATH_BYTES:  # even without its large weights (many small tensors)
        return _infer_shapes_by_path(model, work_dir, stats)
    for data_prop in (True, False):
        try:
            inferred = onnx.shape_inference.infer_shapes(light, strict_mode=False, data_prop=data_prop)
        except Exception as exc:  # inference is best effort; folding works with what it knows
            failure = exc
            continue
        take_value_info(model.graph, inferred.graph)
        return model
    stats.note(f"shape inference failed: {one_line(failure)}")
    return model


def _infer_shapes_by_path(model: onnx.ModelProto, work_dir: Path, stats: Any) -> onnx.ModelProto:
    import onnx

    work_dir.mkdir(parents=True, exist_ok=True)
    source, target, data = (work_dir / name for name in ("infer_in.onnx", "infer_out.onnx", "infer_in.data"))
    # Saving with external data moves the tensors' bytes out of ``model``: it is reloaded in both outcomes.
    onnx.save(model, str(source), save_as_external_data=True, location=data.name)
    try:
        onnx.shape_inference.infer_shapes_path(str(source), str(target), strict_mode=False, data_prop=True)
        return onnx.load(str(target))
    except Exception as exc:  # inference is best effort
        stats.note(f"shape inference failed: {one_line(exc)}")
        return onnx.load(str(source))
    finally:
        for path in (source, target, data):
            path.unlink(missing_ok=True)

