"""Constant folding of an ONNX graph's top level, the onnx-simplifier way.

A node is folded when every input is a constant (a non-overridable
initializer, an earlier folded tensor or an empty optional input), when it is
an official, deterministic op without subgraphs, and when it is not a
QuantizeLinear/DequantizeLinear (a QDQ model keeps its weights quantized).
``Shape`` and ``Size`` fold from statically inferred shapes.  The foldable
nodes are evaluated together in one ONNX Runtime session; when that session
fails, node by node, with ``onnx.reference`` as the fallback.  A folded tensor
above the size limit is not folded: its node stays, the tensor is reported; nor is a large result of a large
initializer that other nodes read too (``_shared_folds``: it would be a second copy of that weight), nor a Cast
that widens a weight stored narrow (float16 or int8 weights cast to float32: it would store them at full width).
Subgraphs (If/Loop/Scan bodies) are folded the same way when asked: a node
inside one folds when its inputs are constants of its own graph or of the
graphs around it; its value becomes an initializer of that subgraph; a
subgraph's outputs stay computed by their nodes.

Edits protobuf directly: ONNX Runtime evaluates the message and its results replace nodes in the same message,
with no other copy of the weights (``qdeploy.graph.edit`` is the editor for pattern rewrites).
"""

from __future__ import annotations

import logging
from collections import ChainMap
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypedDict

from qdeploy.graph.names import NodeNames
from qdeploy.graph.order import drop_unread_constants
from qdeploy.graph.utils import (
    delete_indices,
    delete_where,
    has_subgraph,
    names_read,
    tensor_nbytes,
    tensor_types,
)
from qdeploy.graph.utils import subgraphs as _graphs_in
from qdeploy.stages.simplify._folding_shapes import (
    Scope,
    estimated_bytes,
    partial_shape_value,
    partial_shapes,
    shape_value,
    static_shapes,
    value_infos,
)
from qdeploy.stages.simplify._shared_folds import readers_of, shared_fold, widening_cast

if TYPE_CHECKING:
    import numpy as np
    import onnx

log = logging.getLogger(__name__)

OFFICIAL_DOMAINS = ("", "ai.onnx", "ai.onnx.ml")
# Dropout is random when its training_mode input is true; eliminate_nop_dropout removes the inference ones.
NON_DETERMINISTIC = frozenset({
    "RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike", "Multinomial", "Bernoulli", "Dropout",
})
QDQ_OPS = frozenset({"QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear"})
# Experimental ops once in the default domain that no runtime implements any more.
RETIRED_OPS = frozenset({
    "ATen", "Affine", "ConstantFill", "Crop", "DynamicSlice", "GRUUnit", "GivenTensorFill", "ImageScaler",
    "ParametricSoftplus", "Scale", "ScaledTanh",
})
_ORT_TYPES = {
    "float": 1, "uint8": 2, "int8": 3, "uint16": 4, "int16": 5, "int32": 6, "int64": 7, "string": 8, "bool": 9,
    "float16": 10, "double": 11, "uint32": 12, "uint64": 13,
}
"""ONNX Runtime's ``tensor(<name>)`` types that come back as a numpy array of the same ONNX type."""

MAX_EVAL_BYTES = int(1.8 * 2**30)
"""Largest model ONNX Runtime can take serialised: a bigger batch is evaluated node by node."""

StaticShapes = dict[str, tuple[tuple[int, ...], int]]
"""Tensor name -> (fully static dims, ONNX element type)."""


class SkippedTensor(TypedDict):
    """A tensor left unfolded because of its size (``findings.FoldSkipped`` once in the findings)."""

    tensor: str
    bytes: int | None
    reason: str


@dataclass
class FoldReport:
    """What one folding pass did."""

    folded_nodes: int = 0
    folded_tensors: int = 0
    constants_converted: int = 0
    folded: dict[str, int] = field(default_factory=dict)
    """Name -> bytes of every tensor that folding turned into an initializer."""
    skipped: list[SkippedTensor] = field(default_factory=list)
    """{tensor, bytes, reason} of every tensor left unfolded because of its size."""
    failed_ops: list[str] = field(default_factory=list)
    """Op types that neither ONNX Runtime nor onnx.reference could evaluate."""


_NEVER_FOLDED = NON_DETERMINISTIC | QDQ_OPS | RETIRED_OPS | {"Constant"}


def is_foldable_op(node: onnx.NodeProto) -> bool:
    """Official, deterministic, not Q/DQ, no subgraph: an op whose result is a constant of its inputs."""
    op_type = node.op_type
    return op_type not in _NEVER_FOLDED and node.domain in OFFICIAL_DOMAINS and not has_subgraph(node)


def constant_names(model: onnx.ModelProto) -> set[str]:
    """Initializers that inputs cannot override (IR >= 4 makes an initializer listed as input a default)."""
    overridable = {value.name for value in model.graph.input} if model.ir_version >= 4 else set()
    return {init.name for init in model.graph.initializer if init.name not in overridable} | {""}


def constants_to_initializers(graph: onnx.GraphProto) -> int:
    """Replace Constant nodes of ``graph`` by initializers of the same name; returns how many."""
    converted: set[int] = set()
    for index, node in enumerate(graph.node):
        if node.op_type != "Constant" or node.domain not in OFFICIAL_DOMAINS or len(node.output) != 1:
            continue
        if len(node.attribute) == 1 and node.attribute[0].name == "value":
            target = graph.initializer.add()  # one copy of the tensor, straight into place
            target.CopyFrom(node.attribute[0].t)
            target.name = node.output[0]
        else:
            tensor = _constant_tensor(node)
            if tensor is None:
                continue
            graph.initializer.append(tensor)
        converted.add(index)
    delete_indices(graph.node, converted)
    return len(converted)


def _constant_tensor(node: onnx.NodeProto) -> onnx.TensorProto | None:
    import numpy as np
    import onnx
    from onnx import numpy_helper

    if len(node.attribute) != 1 or len(node.output) != 1:
        return None
    attr = node.attribute[0]
    name = node.output[0]
    if attr.name == "value":
        tensor = onnx.TensorProto()
        tensor.CopyFrom(attr.t)
        tensor.name = name
        return tensor
    makers: dict[str, Callable[[], Any]] = {
        "value_float": lambda: np.array(attr.f, dtype=np.float32),
        "value_floats": lambda: np.array(list(attr.floats), dtype=np.float32),
        "value_int": lambda: np.array(attr.i, dtype=np.int64),
        "value_ints": lambda: np.array(list(attr.ints), dtype=np.int64),
        "value_string": lambda: np.array(attr.s, dtype=object),
        "value_strings": lambda: np.array(list(attr.strings), dtype=object),
    }
    if attr.name not in makers:  # sparse_value: left as a node
        return None
    return numpy_helper.from_array(makers[attr.name](), name)


def top_scope(model: onnx.ModelProto) -> Scope:
    constant = constant_names(model)
    tensors = {init.name: init for init in model.graph.initializer if init.name in constant}
    values = value_infos(model.graph)
    return Scope(model.graph, tensors, static_shapes(model.graph, constant, values),
                 partial=partial_shapes(model.graph, values))


def sub_scope(outer: Scope, graph: onnx.GraphProto) -> Scope:
    """The scope of a subgraph: the outer constants, its own initializers and Constant nodes (minus shadowing
    inputs)."""
    shadowed = {value.name for value in graph.input}
    tensors = {name: tensor for name, tensor in outer.tensors.items() if name not in shadowed}
    tensors.update((init.name, init) for init in graph.initializer if init.name not in shadowed)
    own = constant_node_tensors(graph)
    tensors.update(own)
    # Names are unique in a model: the subgraph's own entries (its inputs included) first, then the outer ones.
    values = value_infos(graph)
    shapes = ChainMap(static_shapes(graph, set(tensors) - set(outer.tensors), values, extra=own), outer.shapes)
    partial = ChainMap(partial_shapes(graph, values), outer.partial)
    return Scope(graph, tensors, shapes, protected={value.name for value in graph.output}, partial=partial,
                 constant_nodes=True)


def constant_node_tensors(graph: onnx.GraphProto) -> dict[str, onnx.TensorProto]:
    """The values of a graph's Constant nodes, as tensors named like their outputs."""
    tensors = {}
    for node in graph.node:
        if node.op_type == "Constant" and node.domain in OFFICIAL_DOMAINS and len(node.output) == 1:
            tensor = _constant_tensor(node)
            if tensor is not None:
                tensors[node.output[0]] = tensor
    return tensors


def plan_folding(scope: Scope, limit_bytes: int,
                 report: FoldReport) -> tuple[list[onnx.NodeProto], dict[str, np.ndarray]]:
    """Nodes to evaluate, in graph order, and the values known without evaluation (Shape/Size)."""
    const = set(scope.tensors) | {""}
    to_evaluate: list[onnx.NodeProto] = []
    known: dict[str, np.ndarray] = {}
    vectors: dict[str, list[int | None]] = {}  # Shape outputs with some dimensions known
    readers = readers_of(scope.graph)
    for node in scope.graph.node:
        if not is_foldable_op(node) or any(name in scope.protected for name in node.output):
            continue
        value = shape_value(node, scope.shapes)
        if value is None:
            value = partial_shape_value(node, scope, vectors, known)
        if value is not None:
            known[node.output[0]] = value
            const.add(node.output[0])
            continue
        if not all(name in const for name in node.input):
            continue
        too_large = [(out, estimated_bytes(out, scope.shapes)) for out in node.output
                     if (estimated_bytes(out, scope.shapes) or 0) > limit_bytes]
        if too_large:
            report.skipped.extend({"tensor": out, "bytes": size, "reason": f"{node.op_type} output above the limit "
                                   f"of {limit_bytes} bytes (from the inferred shape)"} for out, size in too_large)
            continue
        narrow = widening_cast(node, scope)
        if narrow is not None:  # a weight its author stored narrow: folding would store it again at full width
            report.skipped.append({"tensor": node.output[0], "bytes": estimated_bytes(node.output[0], scope.shapes),
                                   "reason": f"Cast of '{narrow[0]}', stored as {_type_name(narrow[1])}: kept "
                                   "narrow, folding would store the weight again at full width"})
            continue
        shared = shared_fold(node, scope, readers)
        if shared is not None:  # a second copy of a weight that stays for its other readers (a tied embedding)
            report.skipped.append({"tensor": node.output[0], "bytes": shared[1], "reason": f"{node.op_type} of "
                                   f"'{shared[0]}', which other nodes read too: folding would store a second copy"})
            continue
        to_evaluate.append(node)
        const.update(name for name in node.output if name)
    return to_evaluate, known


def fold_constants(model: onnx.ModelProto, *, limit_bytes: int, subgraphs: bool = False) -> FoldReport:
    """Fold the top-level graph in place (and the If/Loop/Scan bodies when asked); what was folded and what not."""
    report = FoldReport(constants_converted=constants_to_initializers(model.graph))
    scope = top_scope(model)
    fold_graph(model, scope, limit_bytes, report)
    if subgraphs:
        for node in model.graph.node:
            for graph in _graphs_in(node):
                _fold_subgraph(model, sub_scope(scope, graph), limit_bytes, report)
    return report


def _fold_subgraph(model: onnx.ModelProto, scope: Scope, limit_bytes: int, report: FoldReport) -> None:
    fold_graph(model, scope, limit_bytes, report)
    drop_unread_constants(scope.graph)
    for node in scope.graph.node:
        for graph in _graphs_in(node):
            _fold_subgraph(model, sub_scope(scope, graph), limit_bytes, report)


def fold_graph(model: onnx.ModelProto, scope: Scope, limit_bytes: int, report: FoldReport) -> None:
    """Evaluate the foldable nodes of one graph and replace them by initializers of that graph."""
    nodes, values = plan_folding(scope, limit_bytes, report)
    if not nodes and not values:
        return
    if nodes:
        values.update(evaluate_nodes(model, nodes, values, report, scope.tensors))
    too_large = _drop_unfit(values, limit_bytes, tensor_types(scope.graph))
    still_read = _replace_folded(scope, values, report)
    # A large tensor whose consumers folded into something small is gone, not skipped.
    report.skipped.extend(entry for entry in too_large if entry["tensor"] in still_read)


def evaluate_nodes(model: onnx.ModelProto, nodes: list[onnx.NodeProto], known: dict[str, np.ndarray],
                   report: FoldReport, tensors: dict[str, onnx.TensorProto] | None = None) -> dict[str, np.ndarray]:
    """Values of every output of ``nodes``: one ONNX Runtime session, else node by node.

    ``known`` holds values found without evaluation (Shape/Size) that ``nodes`` may read; ``tensors`` the
    constants they may read (the model's initializers when None).
    """
    from onnx import numpy_helper

    initializers = dict(tensors) if tensors is not None else {init.name: init for init in model.graph.initializer}
    initializers.update((name, numpy_helper.from_array(value, name)) for name, value in known.items())
    if sum(tensor_nbytes(initializers[name]) for name in _outer_inputs(nodes)) <= MAX_EVAL_BYTES:
        try:
            return _run_ort(_fold_model(model, nodes, initializers))
        except Exception as exc:  # any failure of the batch falls back to one node at a time
            log.debug("batch constant folding failed (%s); folding node by node", exc)
    return _evaluate_one_by_one(model, nodes, initializers, report)


def _evaluate_one_by_one(model: onnx.ModelProto, nodes: list[onnx.NodeProto],
                         initializers: dict[str, onnx.TensorProto], report: FoldReport) -> dict[str, np.ndarray]:
    from onnx import numpy_helper

    values: dict[str, np.ndarray] = {}
    for node in nodes:
        if not all(not name or name in initializers or name in values for name in node.input):
            continue  # an input failed to fold
        input_bytes = sum(tensor_nbytes(initializers[name]) if name in initializers else values[name].nbytes
                          for name in set(node.input) if name)
        if input_bytes > MAX_EVAL_BYTES:
            outputs, failures = None, [f"inputs above {MAX_EVAL_BYTES} bytes, too large to evaluate"]
        else:
            inputs = {name: initializers[name] if name in initializers else numpy_helper.from_array(values[name], name)
                      for name in node.input if name}
            outputs, failures = _run_single(_fold_model(model, [node], inputs))
        if outputs is None:
            log.info("cannot fold %s node '%s': %s", node.op_type, node.name, "; ".join(failures))
            report.failed_ops.append(node.op_type)
        else:
            values.update(outputs)
    return values


def _run_single(model: onnx.ModelProto) -> tuple[dict[str, np.ndarray] | None, list[str]]:
    """Every output of a one-node model by ONNX Runtime, else by onnx.reference; None and why when neither can."""
    wanted = {out.name for out in model.graph.output}
    failures = []
    for name, runner in (("onnxruntime", _run_ort), ("onnx.reference", _run_reference)):
        try:
            outputs = runner(model)
        except Exception as exc:  # refusing an op is expected: try the next evaluator
            failures.append(f"{name}: {exc}")
            continue
        if wanted <= outputs.keys():
            return outputs, failures
        failures.append(f"{name}: an output type has no numpy equivalent")
    return None, failures


def _fold_model(model: onnx.ModelProto, nodes: list[onnx.NodeProto],
                initializers: dict[str, onnx.TensorProto]) -> onnx.ModelProto:
    """A model without inputs whose outputs are every output of ``nodes``."""
    from onnx import helper

    outputs = [helper.make_empty_tensor_value_info(name) for node in nodes for name in node.output if name]
    graph = helper.make_graph(list(nodes), "constant_folding", [], outputs,
                              [initializers[name] for name in _outer_inputs(nodes)])
    return helper.make_model(graph, opset_imports=list(model.opset_import), ir_version=max(model.ir_version, 4))


def _outer_inputs(nodes: list[onnx.NodeProto]) -> list[str]:
    """Names ``nodes`` read that none of them produces."""
    produced = {name for node in nodes for name in node.output}
    return sorted({name for node in nodes for name in node.input if name and name not in produced})


def _run_ort(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 3
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    names = [out.name for out in model.graph.output]
    declared = {out.name: _ORT_TYPES.get(out.type.removeprefix("tensor(").removesuffix(")")) for out in
                session.get_outputs()}
    # Types numpy lacks (float8, ...) come back as raw integers: such values are left out, not mistyped.
    return {name: value for name, value in zip(names, session.run(names, {}), strict=True)
            if declared[name] is not None and _onnx_type(value) == declared[name]}


def _run_reference(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    from onnx.reference import ReferenceEvaluator

    names = [out.name for out in model.graph.output]
    return dict(zip(names, ReferenceEvaluator(model).run(names, {}), strict=True))


def _onnx_type(value: Any) -> int | None:
    import numpy as np
    from onnx import helper

    if not isinstance(value, np.ndarray):
        return None
    try:
        return helper.np_dtype_to_tensor_dtype(value.dtype)
    except (KeyError, ValueError, TypeError):
        return None


def _drop_unfit(values: dict[str, Any], limit_bytes: int, types: dict[str, int]) -> list[SkippedTensor]:
    """Forget values that are not tensors of the expected type or exceed the size limit; returns the too large."""
    too_large: list[SkippedTensor] = []
    for name, value in list(values.items()):
        value_type = _onnx_type(value)
        if value_type is None or types.get(name, value_type) != value_type:
            del values[name]  # a sequence, map or optional, or a type lost on the way: not an initializer
        elif value.nbytes > limit_bytes:
            del values[name]
            too_large.append({"tensor": name, "bytes": int(value.nbytes),
                              "reason": f"folded tensor above the limit of {limit_bytes} bytes"})
    return too_large


def _replace_folded(scope: Scope, values: dict[str, np.ndarray], report: FoldReport) -> set[str]:
    """Remove nodes whose every output has a value; add the values still read as initializers of the scope's graph.

    Returns the names the remaining nodes, subgraphs and graph outputs read.
    """
    from onnx import numpy_helper

    graph = scope.graph
    folded = [node for node in graph.node if _all_known(node.output, values) and is_foldable_op(node)
              and not any(name in scope.protected for name in node.output)]
    folded_ids = {id(node) for node in folded}
    kept = [node for node in graph.node if id(node) not in folded_ids]
    read = names_read(kept, graph)
    if not folded:
        return read
    new_inits = [numpy_helper.from_array(_as_array(values[name]), name)
                 for node in folded for name in node.output if name in read]
    delete_where(graph.node, lambda node: id(node) in folded_ids)
    if scope.constant_nodes:
        _prepend_constants(graph, new_inits)
        scope.tensors.update((init.name, init) for init in new_inits)
    else:
        graph.initializer.extend(new_inits)
        scope.tensors.update((init.name, init)
                             for init in graph.initializer[len(graph.initializer) - len(new_inits):])
    as_init = {init.name for init in new_inits}
    delete_where(graph.value_info, lambda value: value.name in as_init)
    report.folded_nodes += len(folded)
    report.folded_tensors += len(new_inits)
    report.folded.update((name, int(values[name].nbytes)) for name in as_init)
    return read


def _type_name(elem_type: int) -> str:
    from onnx import helper

    return helper.tensor_dtype_to_string(elem_type).removeprefix("TensorProto.").lower()


def _all_known(names: Iterable[str], values: dict[str, Any]) -> bool:
    names = [name for name in names if name]
    return bool(names) and all(name in values for name in names)


def _prepend_constants(graph: onnx.GraphProto, tensors: list[onnx.TensorProto]) -> None:
    """Constant nodes holding ``tensors``, placed first in ``graph`` (they read nothing)."""
    from onnx import helper

    names = NodeNames.of(graph)
    nodes = [helper.make_node("Constant", [], [tensor.name], name=names.fresh(f"{tensor.name}_folded"), value=tensor)
             for tensor in tensors]
    kept = list(graph.node)
    del graph.node[:]
    graph.node.extend([*nodes, *kept])


def _as_array(value: np.ndarray) -> np.ndarray:
    """A C-contiguous copy of the same shape: ``np.ascontiguousarray`` alone turns a 0-d scalar into shape (1,)."""
    import numpy as np

    return np.ascontiguousarray(value).reshape(np.shape(value))


def sync_legacy_inputs(model: onnx.ModelProto, *, drop_unused: bool) -> None:
    """IR < 4 lists every initializer as a graph input: list new ones, optionally drop unread ones."""
    from onnx import helper

    if model.ir_version >= 4:
        return
    graph = model.graph
    if drop_unused:
        read = names_read(list(graph.node), graph)
        unread = {init.name for init in graph.initializer if init.name not in read}
        delete_where(graph.initializer, lambda init: init.name in unread)
        delete_where(graph.input, lambda value: value.name in unread)
    listed = {value.name for value in graph.input}
    graph.input.extend(helper.make_tensor_value_info(init.name, init.data_type, list(init.dims))
                       for init in graph.initializer if init.name not in listed)
