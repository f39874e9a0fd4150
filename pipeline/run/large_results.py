"""A stage's large result goes to disk before it is guarded and stored: its weights are then held once, in a file.

A model above protobuf's 2 GB limit cannot be serialised to bytes, so ONNX Runtime (the guard) and the artifact
store must take it from a file.  Saving it once here, with one external data file named as the store names it,
lets the guard load it from that path and the store move the files into its entry: no second save, no copy of
the proto, and the proto in memory drops its weights as onnx writes them.
"""

from __future__ import annotations

import dataclasses
import gc
import logging
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from qdeploy.core.context import StageResult
from qdeploy.graph.external_data import load_graph_only, needs_external_data, save_onnx
from qdeploy.pipeline.publish.store import external_data_files

if TYPE_CHECKING:
    import onnx

__all__ = ["SPILLED_MODEL", "resave_graph", "spill_large_result"]

log = logging.getLogger(__name__)

SPILLED_MODEL = "model.onnx"


def spill_large_result(result: StageResult, folder: Path, data_name: str) -> StageResult:
    """The result saved under ``folder`` with external data when it is too large for one protobuf; else as is."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / SPILLED_MODEL
    if result.path is not None:
        return _adopt_saved(result, path, data_name)
    if _has_unloaded_weights(result.model):
        raise RuntimeError("the stage returned a model whose weights are in an external file it did not name "
                           "(StageResult.path)")
    if not needs_external_data(result.model):
        return result
    save_onnx(result.model, path, location=data_name)
    log.info("large result saved to %s with external data %s", path, data_name)
    # protobuf frees a message's bytes only with the whole message: keep the graph alone from here on
    graph_only = dataclasses.replace(result, model=load_graph_only(path), path=path)
    del result
    gc.collect()
    return graph_only


def resave_graph(result: StageResult) -> None:
    """Write a spilled result's graph again after it changed in memory (its weights stay in the data file)."""
    import onnx

    if result.path is not None:
        onnx.save_model(result.model, str(result.path))


def _has_unloaded_weights(model: onnx.ModelProto) -> bool:
    from onnx.external_data_helper import _get_all_tensors, uses_external_data

    return any(uses_external_data(tensor) and not tensor.HasField("raw_data") for tensor in _get_all_tensors(model))


def _adopt_saved(result: StageResult, path: Path, data_name: str) -> StageResult:
    """Move a model the stage saved itself (in its work folder, deleted next) into ``path``; its one data file is
    renamed ``data_name`` (artifacts of several variants share the published folder, so data names must differ)."""
    import onnx
    from onnx.external_data_helper import _get_all_tensors, uses_external_data


    assert result.path is not None
    data_files = external_data_files(result.path)
    if len(data_files) != 1:
        for data in data_files:
            shutil.move(str(data), str(path.parent / data.name))
        shutil.move(str(result.path), str(path))
        return dataclasses.replace(result, path=path)
    shutil.move(str(data_files[0]), str(path.parent / data_name))
    for tensor in _get_all_tensors(result.model):
        if uses_external_data(tensor):
            for entry in tensor.external_data:
                if entry.key == "location":
                    entry.value = data_name
    onnx.save_model(result.model, str(path))  # the graph alone: its weights are in the data file
    result.path.unlink(missing_ok=True)
    return dataclasses.replace(result, path=path)
