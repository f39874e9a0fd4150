"""ONNX Runtime's quantization pre-processing, one copy of the weights at a time.

ORT's ``quant_pre_process`` runs symbolic shape inference, an ORT_ENABLE_BASIC optimizing session and onnx shape
inference, and each of them holds the whole model, some twice (symbolic inference copies the model it is given,
onnx's ``infer_shapes`` serialises it): 2.8 GB for a 0.5 GB model.  This runs the same three steps in the same
order, and what each reads:

- both shape inferences see a light copy (``qdeploy.graph.light``: large float weights are tagged stand-ins of
  the right type and shape; shapes, indices and small constants keep their values) and hand back value_info only;
- the optimizing session loads the model from a file whose weights sit in a data file, while this process holds
  no copy of them, and writes its result the same way.

The result is tagged as pre-processed the way ORT's tool tags it (its quantizer warns on a model without the tag).
Each step that fails is skipped and said so, as ``quant_pre_process`` does for its optimizer.

ORT's quantizers then get the same treatment: ``load_with_shapes`` and ``with_shapes`` stand in for their shape
inference (which deep-copies, saves and reloads the whole model), and within ``weights_read_on_demand`` they
quantize a graph whose float weights stay in the prepared model's data file, each read when it is quantized.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from qdeploy.core.onnx_wire import load_model
from qdeploy.graph.external_data import remove_saved
from qdeploy.graph.light import light_copy, take_value_info
from qdeploy.graph.names import rename_optimizer_tensors, rename_ort_inlined, tensor_names
from qdeploy.graph.utils import subgraphs

if TYPE_CHECKING:
    import onnx

log = logging.getLogger(__name__)

__all__ = ["load_with_shapes", "onnx_shapes", "optimize_file", "symbolic_shapes",
           "tag_pre_processed", "weights_read_on_demand", "with_shapes"]


SYMBOLIC_STAND_IN_BYTES = 1 << 20
"""Symbolic inference computes with the values of some float constants (scales, masks, position tables), not
only of integer ones: weights from 1 MB are stand-ins, smaller tensors keep their values."""


def symbolic_shapes(model: onnx.ModelProto, work_dir: Path) -> str:
    """ORT's symbolic shape inference on a light copy; its value_info and output types go into ``model``.
    Returns what happened, in words ("" when it worked)."""
    from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference

    light = light_copy(model, min_bytes=SYMBOLIC_STAND_IN_BYTES)
    try:
        with _inside(work_dir):
            inferred = SymbolicShapeInference.infer_shapes(light.model)
    except Exception as exc:  # it refuses some graphs (Reshape of computed shapes, unknown custom ops)
        log.info("symbolic shape inference failed: %s", exc)
        return f"symbolic shape inference failed ({type(exc).__name__}: {exc})".replace(": )", ")")
    if inferred is None:  # what it returns, with a warning, for a model it does not take (opset below 7)
        return "symbolic shape inference did not run (it takes standard-ONNX opset 7 and above)"
    _take_shapes(model.graph, inferred.graph)
    return ""


def onnx_shapes(model: onnx.ModelProto) -> str:
    """onnx shape inference on a light copy; its value_info goes into ``model``.  Returns what happened ("" if fine)."""
    import onnx

    light = light_copy(model)
    try:
        inferred = onnx.shape_inference.infer_shapes(light.model)
    except Exception as exc:  # onnx refuses some graphs (custom domains it does not know are skipped, not this)
        log.info("onnx shape inference failed: %s", exc)
        return f"onnx shape inference failed ({type(exc).__name__}: {exc})"
    _take_shapes(model.graph, inferred.graph)
    return ""


def _take_shapes(graph: onnx.GraphProto, inferred: onnx.GraphProto) -> None:
    """Inferred value_info (subgraphs included) and graph output types: the only things inference adds."""
    take_value_info(graph, inferred)
    if [out.name for out in graph.output] == [out.name for out in inferred.output]:
        del graph.output[:]
        graph.output.extend(inferred.output)


def optimize_file(source: Path, work_dir: Path) -> tuple[onnx.ModelProto, str]:
    """ORT's basic optimizations (constant folding, Conv/BatchNorm and MatMul/Add fusions...) of the model saved
    at ``source`` (weights in a data file, the caller holding no copy): ORT holds the only copy while it
    optimizes, and writes its result the same way, which is then loaded.  Returns the model and what happened
    ("" when the optimizer ran)."""
    import onnxruntime as ort

    target = work_dir / "optimized.onnx"
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    options.optimized_model_filepath = str(target)
    options.enable_cpu_mem_arena = False  # nothing runs; the arena would only keep blocks
    options.add_session_config_entry("session.optimized_model_external_initializers_file_name",
                                     f"{target.name}.data")
    options.add_session_config_entry("session.optimized_model_external_initializers_min_size_in_bytes", "1024")
    before = tensor_names(load_model(source, load_external_data=False).graph)
    try:
        session = ort.InferenceSession(str(source), options, providers=["CPUExecutionProvider"])
        del session
    except Exception as exc:  # the model stays as it was, as quant_pre_process does when its optimizer fails
        log.warning("ONNX Runtime's basic optimizations failed: %s", exc)
        return load_model(source), f"ONNX Runtime's basic optimizations failed ({type(exc).__name__}: {exc})"
    optimized = load_model(target)
    _drop_initializers_nodes_define(optimized.graph)
    rename_ort_inlined(optimized.graph)  # ONNX Runtime inlines again where a build puts a function op back
    rename_optimizer_tensors(optimized.graph, before)  # its passes name from the same bases when they run again
    for leftover in (source, target):  # read whole: their data files are a copy of the model each, on disk
        remove_saved(leftover)
    return optimized, ""


def _drop_initializers_nodes_define(graph: onnx.GraphProto) -> None:
    """ONNX Runtime (1.2x), writing its result with external initializers, turns a subgraph's Constant node into
    an initializer and keeps the node too: the name is then defined twice and no session loads the model.  The
    node stays, as ORT writes it without external initializers."""
    for node in graph.node:
        for sub in subgraphs(node):
            _drop_initializers_nodes_define(sub)
    defined = {output for node in graph.node for output in node.output}
    shadowed = [init for init in graph.initializer if init.name in defined]
    for init in shadowed:
        graph.initializer.remove(init)
    if shadowed:
        log.debug("dropped %d initializers that nodes of graph %r also define", len(shadowed), graph.name)


def tag_pre_processed(model: onnx.ModelProto) -> None:
    """The metadata ORT's quantizer looks for (it warns that a model was not pre-processed without it)."""
    from onnxruntime.quantization.quant_utils import add_pre_process_metadata

    add_pre_process_metadata(model)


@contextlib.contextmanager
def _inside(folder: Path) -> Iterator[None]:
    """Run with folder as the working directory: ORT's symbolic shape inference, when it fails, dumps
    sym_shape_infer_temp.onnx into the working directory (the stage's scratch folder is removed afterwards;
    the user's folder must not collect it)."""
    previous = Path.cwd()
    os.chdir(folder)
    try:
        yield
    finally:
        os.chdir(previous)


def load_with_shapes(path: Path) -> onnx.ModelProto:
    """What ORT's ``load_model_with_shape_infer`` returns (the model, onnx's shapes, the tag that tells its
    quantizers shapes were inferred), with inference on a light copy instead of onnx's ``infer_shapes_path``,
    which parses and writes the whole model once more.  The weights stay references into their files: read
    them within ``weights_read_on_demand``, then the ones left float with ``load_weights_from``."""
    return with_shapes(load_model(Path(path), load_external_data=False))


def with_shapes(model: onnx.ModelProto) -> onnx.ModelProto:
    """ORT's ``save_and_reload_model_with_shape_infer`` in place: its quantizers call it on a model they own, and
    it deep-copies, saves and reloads the whole model to add value_info."""
    from onnxruntime.quantization.quant_utils import add_infer_metadata

    note = onnx_shapes(model)
    if note:
        raise RuntimeError(note)  # ORT's own version raises too; the quantizer step names it
    add_infer_metadata(model)
    return model


_READER_LOCK = threading.Lock()


@contextlib.contextmanager
def weights_read_on_demand(folder: Path) -> Iterator[None]:
    """ORT's quantizers read every weight through ``onnx.numpy_helper.to_array``.  Given a graph-only model (its
    weights external references into files in ``folder``), within this block that call reads an external tensor
    into a copy, so the model's message never takes the bytes: one float weight in memory at a time, where the
    quantizer would hold them all beside their quantized forms.  Other threads get onnx's own function."""
    import onnx
    import onnx.numpy_helper as helper
    from onnx.external_data_helper import load_external_data_for_tensor

    original = helper.to_array
    owner = threading.get_ident()

    def to_array(tensor: onnx.TensorProto, base_dir: str = "") -> Any:
        if threading.get_ident() != owner or tensor.data_location != onnx.TensorProto.EXTERNAL:
            return original(tensor, base_dir)
        loaded = onnx.TensorProto()
        loaded.CopyFrom(tensor)  # the reference only: no weight bytes yet
        load_external_data_for_tensor(loaded, str(folder))
        return original(loaded)

    with _READER_LOCK:
        helper.to_array = to_array
        try:
            yield
        finally:
            helper.to_array = original
