"""Element types of every tensor before fp16 conversion: inference first, then ORT, else a clear error.

The converter places Casts from type information; a float tensor of unknown
type silently gets none.  So every used tensor must be typed: ONNX shape
inference (through a file path for models near or over 2 GB), the same inference
run on each subgraph with its outer-scope names as inputs (onnx does not keep
subgraph value_info), ONNX Runtime's view of tensors onnx cannot type (contrib
ops), and a ModelError naming whatever is still untyped.

Edits protobuf directly: it writes value_info and graph outputs (types, not the node structure that
``qdeploy.graph.edit`` is for) into the model shape inference and ONNX Runtime read as protobuf.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

from qdeploy.core.errors import ModelError
from qdeploy.core.onnx_wire import load_model
from qdeploy.graph.light import light_bytes, light_copy, take_value_info
from qdeploy.stages.fp16._graph import outer_references, subgraphs, walk_graphs, walk_nodes

if TYPE_CHECKING:
    import onnx

log = logging.getLogger(__name__)

FLOAT16 = 10

INFERENCE_BY_PATH_BYTES = 2**31 - 2**26
"""Models at least this big (with external data) are inferred through a file path: protobuf stops at 2 GB."""
MAX_NAMED = 8


def load_typed(model_path: Path, size_bytes: int, work_dir: Path) -> onnx.ModelProto:
    """The model with an element type for every tensor it uses; ModelError naming any that stays untyped."""

    model = load_model(model_path)
    if not _infer_light(model, model_path):
        model = _infer_by_path(model_path, work_dir)
    type_subgraphs(model)
    untyped = untyped_tensors(model)
    if untyped:
        _type_with_onnxruntime(model, untyped, work_dir, big=size_bytes >= INFERENCE_BY_PATH_BYTES)
        untyped = untyped_tensors(model)
    if untyped:
        raise ModelError(_untyped_message(model_path, model, untyped))
    return model


def _infer_light(model: onnx.ModelProto, model_path: Path) -> bool:
    """Shape inference on a copy without the large weights (it reads their shapes, not their bytes): its types
    come back into ``model``'s value_info, so the weights are never serialised.  False when even the light copy
    is too large for protobuf (the caller infers through files)."""
    import onnx


    stripped = light_copy(model)
    light = stripped.model
    if light_bytes(stripped) >= INFERENCE_BY_PATH_BYTES:
        return False
    try:
        inferred = onnx.shape_inference.infer_shapes(light)
    except Exception as exc:  # best effort: what stays untyped is reported below
        log.warning("%s: shape inference failed before fp16 conversion: %s", model_path.name, exc)
        return True
    take_value_info(model.graph, inferred.graph)
    for value, typed in zip(model.graph.output, inferred.graph.output, strict=True):
        if not value.type.tensor_type.elem_type and typed.type.tensor_type.elem_type:
            value.type.CopyFrom(typed.type)
    return True


def _infer_by_path(model_path: Path, work_dir: Path) -> onnx.ModelProto:
    """Shape inference through files (no 2 GB limit), external data loaded from the model's folder."""
    import onnx
    from onnx.external_data_helper import load_external_data_for_model

    inferred = work_dir / "fp16_inferred.onnx"
    try:
        onnx.shape_inference.infer_shapes_path(str(model_path), str(inferred))
        model = onnx.load(str(inferred), load_external_data=False)
    except Exception as exc:
        log.warning("%s: path-based shape inference failed: %s", model_path.name, exc)
        model = onnx.load(str(model_path), load_external_data=False)
    load_external_data_for_model(model, str(model_path.parent))
    inferred.unlink(missing_ok=True)
    return model


def scope_types(graph: onnx.GraphProto, outer: dict[str, int] | None = None) -> dict[str, int]:
    """Known element types of the names visible in a graph (outer scope first, then its own)."""
    types = dict(outer or {})
    for value in (*graph.input, *graph.value_info, *graph.output):
        if value.type.HasField("tensor_type") and value.type.tensor_type.elem_type:
            types[value.name] = value.type.tensor_type.elem_type
    for init in graph.initializer:
        types[init.name] = init.data_type
    for node in graph.node:
        if node.op_type == "Constant" and node.output:
            for attr in node.attribute:
                if attr.name == "value" and attr.HasField("t"):
                    types[node.output[0]] = attr.t.data_type
                elif attr.name in ("value_float", "value_floats"):
                    types[node.output[0]] = 1
    return types


def all_types(model: onnx.ModelProto) -> dict[str, int]:
    """Element types of every typed name of every graph of the model."""
    types: dict[str, int] = {}
    _collect(model.graph, {}, types)
    return types


def _collect(graph: onnx.GraphProto, outer: dict[str, int], into: dict[str, int]) -> None:
    types = scope_types(graph, outer)
    into.update(types)
    for node in graph.node:
        for sub in subgraphs(node):
            _collect(sub, types, into)


def type_subgraphs(model: onnx.ModelProto) -> None:
    """Run shape inference on every subgraph (outer names as typed inputs) and keep its value_info."""
    _type_nested(model, model.graph, scope_types(model.graph))


def _type_nested(model: onnx.ModelProto, graph: onnx.GraphProto, types: dict[str, int]) -> None:
    for node in graph.node:
        for sub in subgraphs(node):
            _infer_subgraph(model, sub, types)
            _type_nested(model, sub, scope_types(sub, types))


def _infer_subgraph(model: onnx.ModelProto, sub: onnx.GraphProto, outer: dict[str, int]) -> None:
    import onnx
    from onnx import helper

    known = scope_types(sub)
    extra = [helper.make_tensor_value_info(name, outer[name], None)
             for name in sorted(outer_references(sub)) if name in outer and name not in known]
    standalone = helper.make_graph(list(sub.node), sub.name or "subgraph", [*sub.input, *extra], list(sub.output),
                                   list(sub.initializer))
    probe = helper.make_model(standalone, opset_imports=list(model.opset_import), ir_version=model.ir_version)
    try:
        inferred = onnx.shape_inference.infer_shapes(probe)
    except Exception as exc:
        log.debug("shape inference of subgraph %s failed: %s", sub.name, exc)
        return
    typed = [value for value in inferred.graph.value_info if value.type.tensor_type.elem_type]
    present = {value.name for value in sub.value_info}
    sub.value_info.extend(value for value in typed if value.name not in present)
    by_name = {value.name: value for value in inferred.graph.output}
    for value in sub.output:
        if not value.type.tensor_type.elem_type and value.name in by_name:
            value.type.CopyFrom(by_name[value.name].type)


def untyped_tensors(model: onnx.ModelProto) -> list[tuple[str, str]]:
    """(tensor, graph name) of used names without an element type in any graph.  A value declared as a sequence,
    map or optional is typed, just not a tensor: float16 conversion leaves it to the ops around it (scikit-learn's
    ZipMap writes a sequence of maps, which only ai.onnx.ml ops, kept in float32, produce)."""
    types = all_types(model)
    types.update(dict.fromkeys(_not_tensors(model), 0))
    found = []
    for graph in walk_graphs(model.graph):
        used = [name for node in graph.node for name in node.input if name]
        used.extend(value.name for value in graph.output)
        for name in dict.fromkeys(used):
            if name not in types:
                found.append((name, graph.name))
    return found


def _not_tensors(model: onnx.ModelProto) -> set[str]:
    """Names every graph declares with a non-tensor type (sequence, map, optional)."""
    return {value.name for graph in walk_graphs(model.graph)
            for value in (*graph.input, *graph.output, *graph.value_info)
            if value.type.WhichOneof("value") not in (None, "tensor_type")}


def _type_with_onnxruntime(model: onnx.ModelProto, untyped: list[tuple[str, str]], work_dir: Path,
                           *, big: bool) -> None:
    """Ask ONNX Runtime for the types of main-graph tensors onnx could not type (e.g. com.microsoft ops)."""
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper

    main = {name for name, graph in untyped if graph == model.graph.name}
    outputs = {value.name for value in model.graph.output}
    wanted = sorted(name for name in main if name not in outputs)
    if not wanted:
        return
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    probe.graph.output.extend(helper.make_empty_tensor_value_info(name) for name in wanted)
    path = work_dir / "fp16_typing.onnx"
    onnx.save(probe, str(path), save_as_external_data=big, location="fp16_typing.data")
    try:
        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    except Exception as exc:
        log.debug("onnxruntime cannot type the model either: %s", exc)
        return
    for value in session.get_outputs():
        if value.name in wanted and value.type.startswith("tensor("):
            elem = getattr(TensorProto, value.type[len("tensor("):-1].upper(), 0)
            if elem:
                model.graph.value_info.append(helper.make_tensor_value_info(value.name, elem, None))


def _untyped_message(model_path: Path, model: onnx.ModelProto, untyped: list[tuple[str, str]]) -> str:
    producers = {out: node for graph in walk_graphs(model.graph) for node in graph.node for out in node.output}
    described = []
    for name, graph in untyped[:MAX_NAMED]:
        node = producers.get(name)
        origin = (f"output of node '{node.name}' ({node.domain + '.' if node.domain else ''}{node.op_type})"
                  if node is not None else "not produced by any node")
        described.append(f"'{name}' ({origin}, graph '{graph}')")
    more = f" and {len(untyped) - MAX_NAMED} more" if len(untyped) > MAX_NAMED else ""
    return (f"{model_path.name}: tensor {', '.join(described)}{more} has no element type: neither ONNX shape "
            "inference nor ONNX Runtime could type it, so float16 conversion cannot tell whether it needs a Cast. "
            "Add a value_info entry with its type to the model (or register the custom op's shape inference), "
            "then run again.")


def float16_compute_nodes(model: onnx.ModelProto) -> int:
    """Nodes (of every graph; not Casts, Constants, Identities, Shapes) that write or read a float16 tensor: none when
    the conversion kept every node float32, or found nothing in float32 to convert."""
    types = all_types(model)
    moves = {"Cast", "Constant", "Identity", "Shape", "Size"}  # they compute nothing in float16
    return sum(1 for node, _ in walk_nodes(model.graph) if node.op_type not in moves
               and any(types.get(name) == FLOAT16 for name in (*node.output, *node.input) if name))
