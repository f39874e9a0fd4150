"""Models above protobuf's 2 GB limit: deciding when to write external data, without serialising the model.

``ModelProto.ByteSize()`` serialises the whole message (a copy of every weight) and raises ``EncodeError`` above
2 GiB, so no decision about a large model may call it.  ``needs_external_data`` sums the tensors from their
shapes (``graph_utils.model_bytes``) instead.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from stages.graph_utils import model_bytes

if TYPE_CHECKING:
    import onnx

PROTOBUF_SAFE_BYTES = 1_800_000_000
"""Above this a model is written as ``.onnx`` plus one data file (protobuf's hard limit is 2 GiB)."""


def needs_external_data(model: onnx.ModelProto, threshold: int | None = None) -> bool:
    """True when the model is too large to be one protobuf file (above ``threshold`` bytes when given)."""
    return model_bytes(model) > (PROTOBUF_SAFE_BYTES if threshold is None else threshold)


def save_onnx(model: onnx.ModelProto, path: Path, *, location: str | None = None, threshold: int | None = None) -> None:
    """Save a model; a large one with all its tensors in one data file beside it (``<name>.data`` by default).

    onnx moves the weights of a large model out of ``model`` into the file as it writes (the proto then refers to
    the file): one copy of the weights, never two.
    """
    import onnx

    path.parent.mkdir(parents=True, exist_ok=True)
    if needs_external_data(model, threshold):
        data_name = location or f"{path.name}.data"
        (path.parent / data_name).unlink(missing_ok=True)  # onnx appends to an existing data file
        onnx.save_model(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                        location=data_name, size_threshold=1024)
    else:
        onnx.save_model(model, str(path))


def load_graph_only(path: Path) -> onnx.ModelProto:
    """A saved model without its external data (its weights stay in the file; the proto refers to them)."""
    import onnx

    return onnx.load(str(path), load_external_data=False)

