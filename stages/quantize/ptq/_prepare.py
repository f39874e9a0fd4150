"""Getting a float model ready for ONNX Runtime's quantizer, and the checks made before quantizing.

- Weights held in Constant nodes (Paddle exports) become initializers: ORT's
  quantizer only quantizes initializers, and would leave such weights float.
- ORT's pre-processing (symbolic shape inference, basic fusions, onnx shape
  inference) runs, each step on what it needs (``_preprocess``).
- Every node gets a name, so that it can be excluded and reported.
- Nodes holding subgraphs (If/Loop/Scan) are listed: their bodies stay float.
"""

from __future__ import annotations

import gc
import logging
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from qdeploy.core.onnx_wire import load_model
from qdeploy.graph.edit import GraphNotEditable
from qdeploy.graph.external_data import save_with_data_file
from qdeploy.graph.names import name_nodes_uniquely, rename_quantizer_derived
from qdeploy.graph.rewrites import RewriteReport, apply_rewrites
from qdeploy.graph.utils import default_opset, subgraphs
from qdeploy.graph.widen import half_to_float32, half_weights, holds_half, narrow_weights
from qdeploy.stages.quantize.findings import PreparedNotes, SubgraphLeftFloat
from qdeploy.stages.quantize.ptq._bias import vector_gemm_biases
from qdeploy.stages.quantize.ptq._preprocess import onnx_shapes, optimize_file, symbolic_shapes, tag_pre_processed

if TYPE_CHECKING:
    import onnx

log = logging.getLogger(__name__)

QUANTIZED_OP_TYPES = frozenset({
    "QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear", "ConvInteger", "MatMulInteger",
    "DynamicQuantizeMatMul", "MatMulIntegerToFloat", "QGemm", "QAttention", "DynamicQuantizeLSTM",
    # com.microsoft: integer, block-quantized and ordered-int8 ops of ONNX Runtime's contrib set
    "MulInteger", "MatMulInteger16", "MatMulNBits", "MatMulBnb4", "MatMulFpQ4", "GatherBlockQuantized",
    "DequantizeBlockwise", "QuantizeBFP", "DequantizeBFP", "QuantizeWithOrder", "DequantizeWithOrder",
    "QEmbedLayerNormalization", "QMoE", "NhwcQLinearConv",
})
_QUANTIZED_PREFIXES = ("QLinear", "QOrdered")
_SUBGRAPH_OPS = ("If", "Loop", "Scan")


@dataclass(frozen=True)
class Prepared:
    """The float model ORT's quantizer reads, and what preparing it did.  Its node names and opset come with it,
    so that nobody parses a one-file model again to read them."""

    path: Path
    findings: PreparedNotes
    nodes: dict[str, str]
    """Main-graph node name -> op type, after pre-processing."""
    original_nodes: frozenset[str]
    """Main-graph node names of the model before pre-processing (it may fuse some away)."""
    opset: int
    undone: Undone
    """What preparing changed that the quantized model gets back."""


@dataclass(frozen=True)
class Undone:
    """What making a model ready for a quantizer changed in its interface and weights, to be given back."""

    half_weights: dict[str, int]
    """A float16 or bfloat16 model's weights, name -> element type: what stays float is stored so again."""
    passthrough_outputs: tuple[tuple[int, bytes], ...] = ()
    """Graph outputs that are graph inputs (position, serialized ValueInfoProto): ORT's quantizer puts Q/DQ on
    such an input and finds a cycle ("Graph is not a DAG"); they are listed again, in place, afterwards."""


def is_quantized_op(node: onnx.NodeProto) -> bool:
    """A quantization op (Q/DQ, QLinear*, *Integer, block-quantized weights...), standard or com.microsoft."""
    return node.op_type in QUANTIZED_OP_TYPES or node.op_type.startswith(_QUANTIZED_PREFIXES)


def quantized_ops(model: onnx.ModelProto) -> Counter[str]:
    """Quantization ops per op type, in every graph: the main graph, If/Loop/Scan bodies and model functions."""
    found: Counter[str] = Counter()
    pending = [model.graph, *model.functions]
    while pending:
        graph = pending.pop()
        for node in graph.node:
            if is_quantized_op(node):
                found[node.op_type] += 1
            pending.extend(subgraphs(node))
    return found


def count_quantized_nodes(model: onnx.ModelProto) -> int:
    """How many nodes of the model (subgraphs and functions included) are quantization ops."""
    return sum(quantized_ops(model).values())


def weight_qdq_pairs(model: onnx.ModelProto) -> int:
    """QuantizeLinear nodes applied to float initializers or Constant outputs: what mode lower folds."""
    constants = {init.name for init in model.graph.initializer if init.data_type in (1, 10, 11, 16)}
    constants |= {out for node in model.graph.node if node.op_type == "Constant" for out in node.output}
    return sum(1 for node in model.graph.node if node.op_type == "QuantizeLinear" and node.input[0] in constants)


def lift_constants(model: onnx.ModelProto) -> tuple[onnx.ModelProto, int]:
    """Constant nodes (every graph) turned into initializers; returns the model and how many were lifted."""
    import onnx_ir as ir
    from onnx_ir.passes.common import LiftConstantsToInitializersPass

    before = _constant_nodes(model)
    if not before:
        return model, 0
    ir_model = ir.from_proto(model)
    LiftConstantsToInitializersPass(lift_all_constants=False, size_limit=0)(ir_model)
    lifted = ir.to_proto(ir_model)
    return lifted, before - _constant_nodes(lifted)


def _constant_nodes(model: onnx.ModelProto) -> int:
    return sum(1 for node in model.graph.node if node.op_type == "Constant")


MIN_OPSET = 13
"""Per-channel QuantizeLinear/DequantizeLinear (the axis attribute) needs opset 13."""


def prepare(source: Path, work_dir: Path) -> Prepared:
    """Lift constants, raise the opset to 13, pre-process as ORT's ``quant_pre_process`` does (symbolic shape
    inference, basic optimizations, onnx shape inference) and name the nodes; written under work_dir.  One copy
    of the weights at a time (``_preprocess``)."""

    model = load_model(source)
    widened, undone = for_quantizer(model)
    # ORT's optimizer refuses repeated node names, and exclusions and the budget find nodes by name
    named = name_nodes_uniquely(model).changed
    original_nodes = frozenset(node.name for node in model.graph.node)
    model, lifted = lift_constants(model)
    model, opset_note = _at_least_opset(model)
    notes = [symbolic_shapes(model, work_dir)]
    unoptimized = work_dir / "optimizer_input.onnx"
    save_with_data_file(model, unoptimized)
    del model
    gc.collect()  # protobuf frees a message's weights only with the message: one copy in memory at a time
    model, optimized = optimize_file(unoptimized, work_dir)
    if not _declares_default_domain(model):
        # no standard op at all (a scikit-learn tree ensemble is ai.onnx.ml only): ORT's quantizer and the Q/DQ
        # nodes need the domain (ORT's optimizer drops an import no node uses, so it is added after it)
        from onnx import helper

        model.opset_import.append(helper.make_opsetid("", MIN_OPSET))
    notes += [optimized, onnx_shapes(model)]
    tag_pre_processed(model)
    named += name_nodes_uniquely(model).changed  # nodes the optimizer added
    renamed = rename_quantizer_derived(model.graph)  # names the quantizer would derive and then define twice
    if renamed:
        log.info("%d tensors renamed: ONNX Runtime's quantizer derives their names from other tensors'", renamed)
    emptied = drop_empty_concat_inputs(model)
    biases = vector_gemm_biases(model)  # after pre-processing: it fuses MatMul + Add into Gemm
    target = work_dir / "preprocessed.onnx"
    save_with_data_file(model, target)  # weights to preprocessed.onnx.data one at a time: read back the same way
    failed = "; ".join(note for note in notes if note)
    subgraphs = subgraph_nodes(model)
    if subgraphs:
        log.warning("%d nodes hold subgraphs; their bodies stay float", len(subgraphs))
    findings = PreparedNotes(preprocess=f"partly: {failed}" if failed else "complete", constants_lifted=lifted,
                             nodes_named=named, opset=opset_note or None, half_precision=widened,
                             subgraphs_left_float=subgraphs or None, empty_concat_inputs_dropped=emptied or None,
                             **biases)
    nodes = {node.name: node.op_type for node in model.graph.node}
    opset = default_opset(model)
    del model
    gc.collect()  # the quantizer loads it again; ORT's objects leave cycles holding parts of it
    return Prepared(target, findings, nodes, original_nodes, opset, undone)


def drop_empty_concat_inputs(model: onnx.ModelProto) -> int:
    """Concat inputs of length 0 dropped (simplify's rewrite of that name, for a model quantized unsimplified):
    ORT's quantizer quantizes an empty constant into a tensor OpenVINO reads as a scalar and cannot concatenate.
    The editor's view of the graph is built only where such an input is."""
    if not _empty_concat_input(model.graph):
        return 0
    report = RewriteReport()
    try:
        apply_rewrites(model, ["drop_empty_concat_inputs"], report)
    except GraphNotEditable as exc:  # an optimisation of the graph the quantizer reads: it stays as it is
        log.info("empty Concat inputs left: %s", exc)
    return report.applied["drop_empty_concat_inputs"]


def _empty_concat_input(graph: onnx.GraphProto) -> bool:
    """Whether a Concat of ``graph`` reads a tensor of static length 0 along its axis (initializer or value_info)."""
    shapes = {value.name: [dim.dim_value if dim.HasField("dim_value") else None
                           for dim in value.type.tensor_type.shape.dim]
              for value in (*graph.input, *graph.value_info, *graph.output)}
    shapes.update({tensor.name: list(tensor.dims) for tensor in graph.initializer})
    for node in graph.node:
        if node.op_type != "Concat" or node.domain not in ("", "ai.onnx"):
            continue
        axis = next((attribute.i for attribute in node.attribute if attribute.name == "axis"), None)
        for shape in (shapes.get(name) for name in node.input):
            if axis is not None and shape and -len(shape) <= axis < len(shape) and shape[axis] == 0:
                return True
    return False


def for_quantizer(model: onnx.ModelProto) -> tuple[str | None, Undone]:
    """The model made ready for ORT's or NNCF's quantizer, in place: float32 inside (``_float32_inside``) and no
    input listed as an output; a note on the widening (None for a float32 model) and what to give back."""
    widened, halves = _float32_inside(model)
    outputs = list(model.graph.output)
    inputs = {value.name for value in model.graph.input}
    passthrough = tuple((index, value.SerializeToString()) for index, value in enumerate(outputs)
                        if value.name in inputs)
    if passthrough:
        del model.graph.output[:]
        model.graph.output.extend(value for value in outputs if value.name not in inputs)
    return widened, Undone(halves, passthrough)


def give_back(model: onnx.ModelProto, undone: Undone) -> None:
    """The quantized model gets what ``for_quantizer`` took: half weights that stayed float in their type again,
    and the inputs passed straight out listed as outputs where they were."""
    import onnx

    narrowed = narrow_weights(model, undone.half_weights)
    if narrowed:
        log.info("%d weights left float are stored in their source's half type again", narrowed)
    if undone.passthrough_outputs:
        outputs = list(model.graph.output)
        for index, serialized in undone.passthrough_outputs:
            outputs.insert(index, onnx.ValueInfoProto.FromString(serialized))
        del model.graph.output[:]
        model.graph.output.extend(outputs)


def _float32_inside(model: onnx.ModelProto) -> tuple[str | None, dict[str, int]]:
    """A float16 or bfloat16 model made float32 inside (in place), its inputs and outputs keeping their types; a
    note on it (None for a float32 model) and its half weights' types by name.  Float16 scales need opset 19,
    ORT's calibration reads float32, and CPUs compute most float16 ops in float32 anyway."""
    if not holds_half(model):
        return None, {}
    halves = half_weights(model)
    kept = half_to_float32(model)
    note = (f"float16/bfloat16 made float32 before quantizing (exact); {kept} inputs and outputs keep their "
            "type through a Cast")
    log.info("the model holds float16 or bfloat16 values: %s", note)
    return note, halves


def _declares_default_domain(model: onnx.ModelProto) -> bool:
    return any(entry.domain in ("", "ai.onnx") for entry in model.opset_import)


def _at_least_opset(model: onnx.ModelProto) -> tuple[onnx.ModelProto, str]:
    """The model converted to opset 13 when it is older (Paddle exports opset 11-12); a note on what happened."""
    import onnx

    opset = default_opset(model)
    if opset >= MIN_OPSET:
        return model, ""
    if not _declares_default_domain(model):
        # ORT's symbolic shape inference returns nothing for a model below opset 7, and no import reads as 0
        from onnx import helper

        model.opset_import.append(helper.make_opsetid("", MIN_OPSET))
        return model, f"the model imports no standard-ONNX opset (it uses none of its ops): opset {MIN_OPSET} added"
    try:
        return onnx.version_converter.convert_version(model, MIN_OPSET), f"converted from {opset} to {MIN_OPSET}"
    except Exception as exc:  # the builder refuses per-channel weights on the old opset, with this reason
        log.warning("converting opset %d to %d failed: %s", opset, MIN_OPSET, exc)
        return model, f"stays {opset}: conversion to {MIN_OPSET} failed ({type(exc).__name__}: {exc})"


def subgraph_nodes(model: onnx.ModelProto) -> list[SubgraphLeftFloat]:
    """Main-graph nodes that hold subgraphs, with how many nodes their bodies have."""
    import onnx

    found = []
    for node in model.graph.node:
        bodies = [attr.g for attr in node.attribute if attr.type == onnx.AttributeProto.GRAPH]
        bodies += [g for attr in node.attribute if attr.type == onnx.AttributeProto.GRAPHS for g in attr.graphs]
        if bodies:
            found.append(SubgraphLeftFloat(node=node.name, op_type=node.op_type,
                                           body_nodes=sum(len(body.node) for body in bodies)))
    return found


def excluded_nodes(prepared: Prepared, names: list[str], patterns: list[str],
                   op_types: list[str]) -> tuple[list[str], list[str]]:
    """Node names to keep float (by name, regex on the name, op type) and the names asked for that do not exist.

    A name may be missing from the prepared model when pre-processing fused its node away; that is
    logged, not an error, when the original model had it.
    """
    present = prepared.nodes
    unknown = [name for name in names if name not in present and name not in prepared.original_nodes]
    fused = [name for name in names if name not in present and name in prepared.original_nodes]
    if fused:
        log.warning("exclude_nodes %s were fused away by pre-processing", fused)
    compiled = [re.compile(pattern) for pattern in patterns]
    chosen = {name for name in names if name in present}
    excluded_types = set(op_types)
    chosen |= {name for name, op_type in present.items()
               if op_type in excluded_types or any(regex.search(name) for regex in compiled)}
    return sorted(chosen), unknown


def drop_unused_opsets(model: onnx.ModelProto) -> None:
    """Remove opset imports of domains no node uses (ORT's pre-processing declares every domain it knows)."""
    used = {node.domain for node in model.graph.node} | {"", "ai.onnx"}
    for entry in [entry for entry in model.opset_import if entry.domain not in used]:
        model.opset_import.remove(entry)
