"""Freezing inputs (``model.inputs[].value``): an input becomes a constant, what depends on it is folded, and an If
whose condition it decides becomes the branch it takes, as OpenVINO's converter does for a frozen input.

Why in export and not in simplify: the exported model is the reference every variant is compared with and an
artifact of its own (the ``[]`` chain); a runtime that cannot read an If of unknown output rank (OpenVINO needs
the rank of a Conv's input when it converts it) must be able to read that one too.

Only what the frozen values reach is folded: a node is evaluated when it reads a frozen (or already folded)
value and every other input is a constant; the rest of the graph stays as exported (simplify folds it).  Folding
and If inlining repeat until neither changes anything, since an inlined branch may read the frozen value again.
Nodes are evaluated one at a time by ONNX Runtime, with ``onnx.reference`` as the fallback; a node neither can
evaluate, or whose result is larger than ``MAX_FOLDED_BYTES``, stays.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from qdeploy.graph.inline_if import inline_constant_ifs
from qdeploy.graph.names import NodeNames
from qdeploy.graph.utils import delete_indices, delete_where, has_subgraph, names_read, subgraphs
from qdeploy.stages.export._values import describe

if TYPE_CHECKING:
    import numpy as np
    import onnx

    from qdeploy.stages.export.findings import FreezeRecord

log = logging.getLogger(__name__)

MAX_FOLDED_BYTES = 16_000_000
"""Largest tensor a folded node may produce (a ConstantOfShape sized by a frozen value could be huge)."""
MAX_ROUNDS = 20
_NEVER_FOLDED = frozenset({"QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear", "Constant",
                           "RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike", "Multinomial",
                           "Bernoulli", "Dropout"})


def freeze_inputs(model: onnx.ModelProto, frozen: dict[str, np.ndarray]) -> FreezeRecord:
    """Turn each frozen input into a constant and fold what it decides, in place; the sidecar's findings."""
    if not frozen:
        return {}
    graph = model.graph
    nodes_before = _count_nodes(graph)
    read_before = names_read(list(graph.node), graph)
    _make_constants(model, frozen)
    known: dict[str, np.ndarray] = dict(frozen)
    folded, inlined = 0, []
    for _ in range(MAX_ROUNDS):
        count = _fold_reached(model, known)
        deciding = _constant_ifs(graph)
        if deciding:
            inline_constant_ifs(model)
        folded += count
        inlined += deciding
        if not count and not deciding:
            break
    _drop_unread(graph, read_before, set(frozen))
    findings: FreezeRecord = {
        "frozen_inputs": {name: {"value": describe(array), "dtype": str(array.dtype)}
                          for name, array in frozen.items()},
        "ifs_inlined": inlined,
        "nodes_folded": folded,
        "nodes_removed": nodes_before - _count_nodes(graph),
    }
    log.info("frozen inputs %s: %d nodes folded, Ifs inlined: %s", sorted(frozen), folded, inlined or "none")
    return findings


def _make_constants(model: onnx.ModelProto, frozen: dict[str, np.ndarray]) -> None:
    """Each frozen input leaves the graph's inputs and becomes an initializer (a Constant node below IR 4, where
    an initializer must be listed as an input and a caller could override it)."""
    from onnx import helper, numpy_helper

    graph = model.graph
    delete_where(graph.input, lambda value: value.name in frozen)
    delete_where(graph.value_info, lambda value: value.name in frozen)
    tensors = [numpy_helper.from_array(array, name) for name, array in frozen.items()]
    if model.ir_version >= 4:
        graph.initializer.extend(tensors)
        return
    names = NodeNames.of(graph)
    constants = [helper.make_node("Constant", [], [tensor.name], name=names.fresh(f"{tensor.name}_frozen"),
                                  value=tensor) for tensor in tensors]
    kept = list(graph.node)
    del graph.node[:]
    graph.node.extend([*constants, *kept])


def _constants(model: onnx.ModelProto, known: dict[str, np.ndarray]) -> set[str]:
    graph = model.graph
    inputs = {value.name for value in graph.input}
    names = {init.name for init in graph.initializer if init.name not in inputs}
    names |= {node.output[0] for node in graph.node if node.op_type == "Constant" and len(node.output) == 1}
    return names | set(known) | {""}


def _fold_reached(model: onnx.ModelProto, known: dict[str, np.ndarray]) -> int:
    """Evaluate the nodes of the main graph that read a frozen or folded value and only constants; how many."""
    from onnx import numpy_helper

    graph = model.graph
    constant = _constants(model, known)
    outputs = {value.name for value in graph.output}
    folded: list[int] = []
    for index, node in enumerate(graph.node):
        if not _foldable(node) or not any(name in known for name in node.input) \
                or not all(name in constant for name in node.input) or any(name in outputs for name in node.output):
            continue
        values = _evaluate(model, node, known)
        if values is None:
            continue
        known.update(values)
        constant.update(values)
        folded.append(index)
    if not folded:
        return 0
    produced = [name for index in folded for name in graph.node[index].output if name]
    delete_indices(graph.node, folded)
    read = names_read(list(graph.node), graph)
    graph.initializer.extend(numpy_helper.from_array(known[name], name) for name in produced if name in read)
    delete_where(graph.value_info, lambda value: value.name in known)
    return len(folded)


def _foldable(node: onnx.NodeProto) -> bool:
    return node.domain in ("", "ai.onnx") and node.op_type not in _NEVER_FOLDED and not has_subgraph(node)


def _evaluate(model: onnx.ModelProto, node: onnx.NodeProto,
              known: dict[str, np.ndarray]) -> dict[str, np.ndarray] | None:
    """The node's outputs from its constant inputs, by ONNX Runtime or onnx.reference; None when neither can, or
    when a result is too large to keep as a constant."""
    import numpy as np
    import onnx
    from onnx import helper, numpy_helper

    tensors = {init.name: init for init in model.graph.initializer}
    tensors.update((node_.output[0], node_.attribute[0].t) for node_ in model.graph.node
                   if node_.op_type == "Constant" and len(node_.attribute) == 1 and node_.attribute[0].name == "value")
    initializers = []
    for name in dict.fromkeys(filter(None, node.input)):
        if name in known:
            initializers.append(numpy_helper.from_array(known[name], name))
        elif name in tensors:
            tensor = onnx.TensorProto()
            tensor.CopyFrom(tensors[name])
            tensor.name = name
            initializers.append(tensor)
        else:
            return None  # a Constant of another form (value_int, ...): left to simplify
    names = [name for name in node.output if name]
    one = helper.make_model(
        helper.make_graph([node], "fold", [], [helper.make_empty_tensor_value_info(name) for name in names],
                          initializers),
        opset_imports=list(model.opset_import), ir_version=max(model.ir_version, 4))
    for runner in (_run_ort, _run_reference):
        try:
            values = dict(zip(names, runner(one, names), strict=True))
        except Exception as exc:  # refusing an op is expected: try the next evaluator
            log.debug("cannot fold %s node '%s' with %s: %s", node.op_type, node.name, runner.__name__, exc)
            continue
        arrays = {name: np.asarray(value) for name, value in values.items()}
        if all(array.dtype != object and array.nbytes <= MAX_FOLDED_BYTES for array in arrays.values()):
            return arrays
        return None
    return None


def _run_ort(model: onnx.ModelProto, names: list[str]) -> list[Any]:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 3
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(names, {})


def _run_reference(model: onnx.ModelProto, names: list[str]) -> list[Any]:
    from onnx.reference import ReferenceEvaluator

    return ReferenceEvaluator(model).run(names, {})


def _constant_ifs(graph: onnx.GraphProto) -> list[str]:
    """Names of the main graph's Ifs whose condition is now a constant."""
    inputs = {value.name for value in graph.input}
    constant = {init.name for init in graph.initializer if init.name not in inputs}
    constant |= {node.output[0] for node in graph.node if node.op_type == "Constant" and len(node.output) == 1}
    return [node.name or node.output[0] for node in graph.node
            if node.op_type == "If" and node.domain in ("", "ai.onnx") and node.input and node.input[0] in constant]


def _drop_unread(graph: onnx.GraphProto, read_before: set[str], frozen: set[str]) -> None:
    """Constants that freezing left unread (the frozen value once folded away, a Constant only the folded nodes
    read); constants nothing read before are the exporter's, left alone."""
    read = names_read(list(graph.node), graph)
    doomed = {name for name in read_before | frozen if name not in read}
    delete_where(graph.initializer, lambda init: init.name in doomed)
    delete_where(graph.node, lambda node: node.op_type == "Constant" and not node.input
                 and len(node.output) == 1 and node.output[0] in doomed)


def _count_nodes(graph: onnx.GraphProto) -> int:
    return sum(1 + sum(_count_nodes(body) for body in subgraphs(node)) for node in graph.node)
