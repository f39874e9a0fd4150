"""The float32 model's weights on disk while an analysis session holds its own copy of them.

The stage keeps the typed float32 model for the whole run (conversion, repair and clamping counts read its
weights).  While ONNX Runtime runs the float32 probe or the float16 emulation twin, it holds its own copy of the
weights it computes with: with the model's beside them that is one copy too many.  ``offload`` writes the
model's large weights to a data file in the stage's work folder, one tensor at a time, and hands back the graph
alone (its weights refer to that file, so a probe written into the same folder reads them from there, and
protobuf frees a message's bytes only with the whole message: the full one must be dropped); ``reload`` reads
them back into it, tensor by tensor, leaving the model as it was.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from qdeploy.graph.external_data import load_weights_from, remove_saved, save_with_data_file
from qdeploy.graph.utils import model_bytes

if TYPE_CHECKING:
    import onnx

__all__ = ["OFFLOAD_ABOVE_BYTES", "Offloaded", "offload", "reload"]

OFFLOAD_ABOVE_BYTES = 64_000_000
"""Smaller models keep their weights in memory: writing and reading them would cost more than it saves."""
_FILE = "float32_weights.onnx"


class Offloaded:
    """What ``reload`` needs to give the model back exactly: the initializers that carried a data_location."""

    def __init__(self, folder: Path, explicit_location: set[str]) -> None:
        self.folder = folder
        self.explicit_location = explicit_location


def worth_offloading(model: onnx.ModelProto) -> bool:
    return model_bytes(model) > OFFLOAD_ABOVE_BYTES


def offload(model: onnx.ModelProto, folder: Path) -> tuple[onnx.ModelProto, Offloaded]:
    """The model's graph with its weights from 1 KB in ``folder/float32_weights.onnx.data``; drop ``model``."""
    import onnx

    explicit = {tensor.name for tensor in model.graph.initializer if tensor.HasField("data_location")}
    path = folder / _FILE
    save_with_data_file(model, path)
    return onnx.load(str(path), load_external_data=False), Offloaded(folder, explicit)


def reload(model: onnx.ModelProto, offloaded: Offloaded) -> None:
    """The offloaded weights read back into ``model`` one tensor at a time; the files removed."""
    import onnx

    load_weights_from(model, offloaded.folder)
    for tensor in model.graph.initializer:  # the model as it was: marked where it was marked
        if tensor.name in offloaded.explicit_location:
            tensor.data_location = onnx.TensorProto.DEFAULT
    remove_saved(offloaded.folder / _FILE)
