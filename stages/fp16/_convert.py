"""Calling onnxconverter-common, counting what it clamps, and checking what comes out.

The converter does the conversion itself.  Two of its clean-up steps are
replaced during the call by qdeploy's own (applied afterwards by
qdeploy.stages.fp16._repair): its topological sort, which is quadratic in the node count
and ignores subgraph references, and its Cast-pair removal, which keys nodes by
name and raises on some graphs.  Everything else is the converter's.

The converter gets a light copy of the model (``qdeploy.graph.light``: large weights as tags), so it never
copies the weights; it decides which initializers become float16 (those no blocked node reads), and the
tagged ones it chose are converted here from the float32 model, in pieces, with the converter's own clamping
function.  That replaces a float32 copy of the model plus the converter's whole-array temporaries (an int64
index array per weight) by one float16 copy of the weights.

Edits protobuf directly, not through ``qdeploy.graph.edit``: the converter takes and returns protobuf, tags
included, and ``constant_outputs_behind_identity`` renames an initializer, which an edit session's write-back
does by deleting it and adding a serialised copy (its bytes copied).
"""

from __future__ import annotations

import contextlib
import logging
import math
import threading
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from qdeploy.core.errors import StageError
from qdeploy.core.onnx_wire import load_model
from qdeploy.graph.external_data import STREAM_ABOVE_BYTES, save_onnx
from qdeploy.graph.light import light_copy, put_back, tag_of
from qdeploy.graph.utils import float32_chunks, fresh_name, model_bytes
from qdeploy.stages.fp16._graph import FLOAT, FLOAT16, walk_graphs, walk_nodes
from qdeploy.targets.ort_probe import load_error

if TYPE_CHECKING:
    import numpy as np
    import onnx

    from qdeploy.stages.fp16.findings import ClampRecord

log = logging.getLogger(__name__)

STAGE = "fp16"
MAX_LISTED_INITIALIZERS = 50
REPLACED_STEPS = ("sort_topology", "remove_unnecessary_cast_node")
_CONVERTER_LOCK = threading.RLock()  # re-entered: the two patches of one call nest


def float16_clamper(min_positive_val: float, max_finite_val: float) -> Callable[[np.ndarray], np.ndarray]:
    """float32 array -> float16 array clamped exactly as the converter clamps (its own function, silenced)."""
    import numpy as np
    from onnxconverter_common.float16 import convert_np_to_float16

    def to_float16(values: np.ndarray) -> np.ndarray:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            flat = np.asarray(values, dtype=np.float32).reshape(-1)  # it handles 1-D arrays only
            return convert_np_to_float16(flat, min_positive_val, max_finite_val).reshape(np.shape(values))

    return to_float16


@contextlib.contextmanager
def _own_cleanup_steps() -> Iterator[None]:
    """Skip the converter's sort and Cast-pair removal for the duration of one call (ours run afterwards)."""
    import onnxconverter_common.float16 as converter

    saved = {name: getattr(converter, name) for name in REPLACED_STEPS if hasattr(converter, name)}
    with _CONVERTER_LOCK:
        for name in saved:
            setattr(converter, name, lambda *args, **kwargs: None)
        try:
            yield
        finally:
            for name, step in saved.items():
                setattr(converter, name, step)


def convert(model: onnx.ModelProto, *, min_positive_val: float, max_finite_val: float, keep_io_types: bool,
            op_block_list: list[str], node_block_list: list[str], variant: str) -> onnx.ModelProto:
    """onnxconverter-common's conversion of a light copy of the model, its large weights converted here after;
    ``model`` is left as it was.  The converter's per-value warnings are counted, not printed."""
    from onnxconverter_common.float16 import convert_float_to_float16


    light = light_copy(model)
    with warnings.catch_warnings(), _own_cleanup_steps(), _tags_marked_not_converted():
        warnings.simplefilter("ignore")  # one warning per clamped tensor: counted in findings instead
        try:
            converted = convert_float_to_float16(
                light.model, min_positive_val=min_positive_val, max_finite_val=max_finite_val,
                keep_io_types=keep_io_types, disable_shape_infer=True,
                op_block_list=op_block_list, node_block_list=node_block_list,
            )
        except Exception as exc:
            raise StageError(STAGE, variant, f"onnxconverter-common failed: {exc}") from exc
    _fill_tags(converted, light.originals, float16_clamper(min_positive_val, max_finite_val))
    return converted


def constant_outputs_behind_identity(model: onnx.ModelProto) -> list[str]:
    """A graph output that is an initializer (folding made it a constant) has no node for the converter to put a
    Cast after: it would turn the tensor float16 under an output still declared float32, which onnx.checker
    refuses.  Each such output is produced by an Identity of the renamed initializer instead; the Identity
    nodes' names are returned (blocked with keep_io_types, so the constant and the output stay float32)."""
    from onnx import TensorProto, helper

    initializers = {init.name: init for init in model.graph.initializer}
    taken = {*initializers, *(out for node in model.graph.node for out in node.output),
             *(node.name for node in model.graph.node)}
    added = []
    for output in model.graph.output:
        init = initializers.get(output.name)
        if init is None or init.data_type != TensorProto.FLOAT:
            continue
        source, node = fresh_name(f"{output.name}_constant", taken), fresh_name(f"{output.name}_as_output", taken)
        init.name = source
        model.graph.node.append(helper.make_node("Identity", [source], [output.name], name=node))
        added.append(node)
    return added


@contextlib.contextmanager
def _tags_marked_not_converted() -> Iterator[None]:
    """During the call, the converter's tensor conversion only retypes a tagged tensor (``_fill_tags`` converts
    its values); other tensors go through the converter's own function."""
    import onnxconverter_common.float16 as converter


    original = converter.convert_tensor_float_to_float16

    def convert_tensor(tensor: Any, *args: Any, **kwargs: Any) -> Any:
        if tensor.data_type == FLOAT and tag_of(tensor) is not None:
            tensor.data_type = FLOAT16
            return tensor
        return original(tensor, *args, **kwargs)

    with _CONVERTER_LOCK:
        converter.convert_tensor_float_to_float16 = convert_tensor
        try:
            yield
        finally:
            converter.convert_tensor_float_to_float16 = original


def _fill_tags(converted: onnx.ModelProto, originals: dict[bytes, onnx.TensorProto],
               to_float16: Callable[[np.ndarray], np.ndarray]) -> None:
    """Give each tagged initializer its values: float16 ones where the converter chose float16, else the original."""
    for init in converted.graph.initializer:
        tag = tag_of(init)
        if tag is None:
            continue
        original = originals[tag]
        if init.data_type == FLOAT16:
            init.raw_data = _float16_bytes(original, to_float16)
        else:
            put_back(init, original)


def _float16_bytes(tensor: onnx.TensorProto, to_float16: Callable[[np.ndarray], np.ndarray]) -> bytes:
    """A float32 tensor's values as clamped float16 bytes, converted piece by piece (clamping is elementwise)."""
    import numpy as np

    out = np.empty(math.prod(tensor.dims), np.float16)
    start = 0
    for chunk in float32_chunks(tensor):
        out[start:start + chunk.size] = to_float16(chunk)
        start += chunk.size
    return out.tobytes()


def already_float16(model: onnx.ModelProto) -> list[str]:
    """Names of float16 tensors or Casts to float16 already in the model (the converter refuses those)."""
    found = [init.name for graph in walk_graphs(model.graph) for init in graph.initializer
             if init.data_type == FLOAT16]
    found += [value.name for graph in walk_graphs(model.graph)
              for value in (*graph.input, *graph.output, *graph.value_info)
              if value.type.tensor_type.elem_type == FLOAT16]
    found += [node.name for node, _ in walk_nodes(model.graph) if node.op_type == "Cast"
              and any(attr.name == "to" and attr.i == FLOAT16 for attr in node.attribute)]
    return found


def count_clamping(original: onnx.ModelProto, converted: onnx.ModelProto, copies: dict[str, str],
                   float32_nodes: set[str], min_positive_val: float, max_finite_val: float) -> ClampRecord:
    """What the conversion clamped: per float32 constant that became float16, how many values and how much."""
    counts: dict[str, int] = {}
    worst = 0.0
    for name, array in _converted_constants(original, converted, copies, float32_nodes):
        count, change = clamped(array, min_positive_val, max_finite_val)
        if count:
            counts[name] = counts.get(name, 0) + count
            worst = max(worst, change)
    listed = dict(sorted(counts.items(), key=lambda item: (-item[1], item[0]))[:MAX_LISTED_INITIALIZERS])
    clamp: ClampRecord = {
        "min_positive_val": min_positive_val,
        "max_finite_val": max_finite_val,
        "clamped_values": sum(counts.values()),
        "initializers": listed,
        "max_relative_change": worst,
    }
    if len(counts) > len(listed):
        clamp["initializers_not_listed"] = len(counts) - len(listed)
    return clamp


def _converted_constants(original: onnx.ModelProto, converted: onnx.ModelProto, copies: dict[str, str],
                         float32_nodes: set[str]) -> Iterator[tuple[str, np.ndarray]]:
    """(name, original float32 values) of every initializer and node-attribute tensor now stored as float16."""
    import numpy as np
    from onnx import numpy_helper

    sources = {init.name: init for graph in walk_graphs(original.graph) for init in graph.initializer}
    for graph in walk_graphs(converted.graph):
        for init in graph.initializer:
            source = sources.get(copies.get(init.name, init.name))
            if init.data_type == FLOAT16 and source is not None and source.data_type == FLOAT:
                for chunk in float32_chunks(source):  # a large weight in pieces, the same name each time
                    yield source.name, chunk
    for node, _ in walk_nodes(original.graph):
        if node.name in float32_nodes:
            continue
        for attr in node.attribute:
            tensors = ([attr.t] if attr.HasField("t") else []) + list(attr.tensors)
            label = node.output[0] if node.op_type == "Constant" and node.output else f"{node.name}.{attr.name}"
            for tensor in tensors:
                if tensor.data_type == FLOAT:
                    yield label, numpy_helper.to_array(tensor)
            if attr.name in ("value_float", "value_floats") and node.op_type == "Constant":
                yield label, np.asarray(attr.f if attr.name == "value_float" else list(attr.floats), np.float32)


def clamped(array: np.ndarray, min_positive_val: float, max_finite_val: float) -> tuple[int, float]:
    """How many values clamping changes, and the largest relative change among them."""
    import numpy as np

    magnitude = np.abs(array).ravel()
    big = magnitude[(magnitude > max_finite_val) & np.isfinite(magnitude)].astype(np.float64)
    tiny = magnitude[(magnitude > 0) & (magnitude < min_positive_val)].astype(np.float64)
    changes = [float(((big - max_finite_val) / big).max())] if big.size else []
    if tiny.size:
        changes.append(float(((min_positive_val - tiny) / tiny).max()))
    return int(big.size + tiny.size), max(changes, default=0.0)


def written_for_check(model: onnx.ModelProto, work_dir: Path, *, big: bool) -> tuple[onnx.ModelProto, str | None]:
    """A large model saved for ``check``; (the model to publish, read back from that file, and the file; the model
    itself and None when small).  Saving with external data moves the weights out of the message, hence the
    read back; the caller drops the message it passed."""
    import onnx


    path = work_dir / "fp16_check.onnx"
    if big:  # protobuf cannot serialise it in one piece: check through a file with external data
        onnx.save(model, str(path), save_as_external_data=True, location="fp16_check.data")
    elif model_bytes(model) > STREAM_ABOVE_BYTES:  # written tensor by tensor, then read by each checker in turn
        save_onnx(model, path)
    else:
        return model, None
    return load_model(path), str(path)


def check(model: onnx.ModelProto, source: str | None, variant: str, *, onnxruntime_check: bool,
          loaded: bool = False) -> str:
    """onnx.checker with full checks (strict type inference), then an ORT CPU session, of ``model`` or of its file
    ``source`` when it has one (not again when this very model ``loaded`` already); StageError if one fails."""
    import onnx

    try:
        onnx.checker.check_model(source or model, full_check=True)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as exc:
        raise StageError(STAGE, variant, f"the fp16 model fails onnx.checker (full check): {exc}") from exc
    if not onnxruntime_check:
        return "onnx.checker full_check passed; onnxruntime load not checked (onnxruntime_check: false)"
    if loaded:
        return "onnx.checker full_check passed; loads in onnxruntime CPUExecutionProvider"
    # default session options on purpose: ORT's graph optimisations are where mixed precision breaks, and where
    # it may crash: the load runs in a child process (qdeploy.targets.ort_probe)
    error = load_error(Path(source) if source else model)
    if error is not None:
        raise StageError(STAGE, variant, f"the fp16 model does not load in ONNX Runtime: {error}; keep the nodes "
                                         "involved float32 (node_block_list) or deploy it on another runtime")
    return "onnx.checker full_check passed; loads in onnxruntime CPUExecutionProvider"
