"""``mode: weight_only``: int4/int8 weights with float activations, file to file, in bounded memory.

What it touches: every MatMul whose second input is a constant 2-D float weight, and every Gather whose data is
a constant 2-D float table gathered on axis 0 (embeddings); the LM head (a MatMul whose output reaches a graph
output through shape-only ops) gets ``lm_head`` bits, embeddings ``embeddings`` bits ("float" keeps them).
``method: rtn`` (the default) rounds to nearest per block of ``group_size`` weights along the reduction axis, no
data; ``method: gptq`` chooses the MatMul integers on calibration data (``_gptq``), ``scale_estimation`` fits
each block's scale and zero point (``_scales``; float zero points with ``zero_points: float``), and ``ratio``
below 1 keeps the MatMuls most sensitive to int4 in int8 (``_data``); the calibration statistics are computed once
per model and data (``_stats_cache``).  A MatMul reading ``Transpose(table)`` (a tied LM head) is quantized from
the table itself.  Same tensors and ops either way.

Two forms of the same values (``weight_format``):

- ``matmulnbits`` (default): ``com.microsoft.MatMulNBits`` and ``GatherBlockQuantized``.  ONNX Runtime runs
  it with its blocked int4/int8 kernels (``accuracy_level`` 4: activations quantized per block at run time, the
  fast CPU path; 0 dequantizes to float and was 2-9x slower than float32 on an AVX2 CPU); OpenVINO's ONNX reader
  turns MatMulNBits into a compressed FullyConnected (u4/u8 weights) too, so one artifact serves both runtimes;
- ``dequantize_linear``: the standard opset-21 form ``DequantizeLinear(q, scale, zero_point, axis,
  block_size) -> MatMul / Gather`` (the model's opset raised to 21 on the graph alone), for runtimes without
  Microsoft's ops.

Blocks: ``group_size`` where it divides a weight's quantized axis, else the largest power of two that does, else
int8 with a scale per output channel (``_weight_blocks``: what OpenVINO reads as ONNX Runtime does); each choice
that is not ``group_size`` is in ``WeightOnlyReport.blocks``.

Memory: the graph is loaded with ``load_external_data=False``; each weight is read through a read-only memory
map of its data file, quantized in slices and appended to the output's one data file; weights left float are
copied file to file in 64 MB pieces.  The peak is the graph plus one slice, not the model.

Edits protobuf directly: it streams weights file to file, which the graph-only message allows; its node
edits are one-for-one swaps (MatMul -> MatMulNBits).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal, TypedDict

import numpy as np
import onnx
from onnx import TensorProto, helper

from qdeploy.core.memory import release_memory
from qdeploy.core.onnx_wire import load_model
from qdeploy.graph.names import NodeNames, name_nodes_uniquely
from qdeploy.graph.utils import default_opset, node_readers, subgraph_references
from qdeploy.stages.quantize.findings import AwqSearch, MixedPrecision, WeightBlock
from qdeploy.stages.quantize.weight_only._awq import awq_scales, input_scalings
from qdeploy.stages.quantize.weight_only._blocks import block_for
from qdeploy.stages.quantize.weight_only._data import activation_hessians, matmul_block, needs_data, plan
from qdeploy.stages.quantize.weight_only._files import DataFile, Weights
from qdeploy.stages.quantize.weight_only._gptq import gptq
from qdeploy.stages.quantize.weight_only._pack import (
    grouped_tensors,
    matmulnbits_tensors,
    pack_int4,
    packed_matmulnbits,
)
from qdeploy.stages.quantize.weight_only._scales import estimate_blocks
from qdeploy.stages.quantize.weight_only._stats_cache import cached_statistics

if TYPE_CHECKING:
    from qdeploy.stages.quantize.config import WeightOnlyConfig

log = logging.getLogger(__name__)

PER_AXIS_OPSET = 13
"""First opset whose DequantizeLinear takes a scale per channel (``axis``): the int8 form of a weight no block
divides."""
SHAPE_ONLY_OPS = frozenset({"Reshape", "Transpose", "Cast", "Identity", "Squeeze", "Unsqueeze", "Flatten"})
WEIGHT_ONLY_OPS = ("MatMul", "Gather")


class QuantizedWeight(TypedDict):
    """One node whose weight was quantized (``WeightOnlyReport.quantized``): its op, weight, bits, block, method."""

    op: str
    weight: str
    bits: int
    block_size: int | None
    method: str


@dataclass
class WeightOnlyReport:
    """What was quantized, at which bits, and what stayed float (with why)."""

    quantized: dict[str, QuantizedWeight] = field(default_factory=dict)
    kept_float: dict[str, str] = field(default_factory=dict)
    bytes_out: int = 0
    calibration_samples: int = 0
    statistics_reused: bool = False
    """The calibration statistics came from the run's cache (another variant computed them)."""
    mixed: MixedPrecision | None = None
    """What ``ratio`` measured and chose (``_weight_only_data.plan``); None at ratio 1."""
    awq: dict[str, AwqSearch] = field(default_factory=dict)
    """Input -> what the awq search found for the MatMuls reading it (``_awq``)."""
    blocks: dict[str, WeightBlock] = field(default_factory=dict)
    """Weight -> the block it got where that is not ``group_size`` (``block_size``: null for per-channel int8), the
    length of its quantized axis, and why."""


@dataclass(frozen=True)
class _Target:
    node: onnx.NodeProto
    weight: str
    kind: Literal["matmul", "gather"]
    bits: int
    transposed_from: str | None = None
    """The 2-D initializer ``weight`` is the Transpose of (a tied LM head reading the embedding table)."""
    fixed: bool = False
    """Bits set by ``lm_head``/``embeddings``: ``ratio`` leaves it alone."""
    hessian: np.ndarray | None = field(default=None, compare=False)
    """X^T X / rows of the MatMul's input: GPTQ chooses its integers (``method: gptq``)."""


def _reaches_output(name: str, graph: onnx.GraphProto, consumers: dict[str, list[onnx.NodeProto]]) -> bool:
    """Whether ``name`` becomes a graph output through shape-only ops (the logits of an LM head)."""
    outputs = {value.name for value in graph.output}
    frontier, seen = [name], set()
    while frontier:
        current = frontier.pop()
        if current in outputs:
            return True
        if current in seen:
            continue
        seen.add(current)
        frontier.extend(out for node in consumers.get(current, []) if node.op_type in SHAPE_ONLY_OPS
                        for out in node.output)
    return False


def _float_2d(init: TensorProto | None) -> bool:
    return init is not None and init.data_type in (TensorProto.FLOAT, TensorProto.FLOAT16) and len(init.dims) == 2


def find_targets(model: onnx.ModelProto, config: WeightOnlyConfig, report: WeightOnlyReport) -> list[_Target]:
    """MatMul/Gather nodes whose weights are quantized, with their bits; what stays float is reported."""
    graph = model.graph
    inits = {init.name: init for init in graph.initializer}
    consumers = node_readers(graph.node)
    read_inside = subgraph_references(graph)
    op_types = config.op_types or list(WEIGHT_ONLY_OPS)
    transposes = _transposed_initializers(graph, inits)
    targets = []
    for node in graph.node:
        if node.op_type not in op_types or node.domain not in ("", "ai.onnx"):
            continue
        kind: Literal["matmul", "gather"] = "matmul" if node.op_type == "MatMul" else "gather"
        weight = node.input[1] if kind == "matmul" else node.input[0]
        stored = transposes.get(weight) if kind == "matmul" else None
        if not _float_2d(inits.get(stored or weight)):
            continue
        why = _kept_because(node, stored or weight, config, read_inside)
        if inits[stored or weight].data_type == TensorProto.FLOAT16:  # MatMulNBits' scales would be float16 too
            why = why or "float16 weight: put weight_only before fp16 in the variant's steps"
        policy, head = "same", False
        if not why:
            head = kind == "matmul" and _reaches_output(node.output[0], graph, consumers)
            policy = config.embeddings if kind == "gather" else (config.lm_head if head else "same")
            if policy == "float":
                why = "LM head kept float (lm_head: float)" if kind == "matmul" else \
                    "embedding kept float (embeddings: float)"
        if why:
            report.kept_float[node.name] = why
            continue
        targets.append(_Target(node, weight, kind, 8 if policy == "int8" else config.bits, transposed_from=stored,
                               fixed=kind == "gather" or head))
    return targets


def _transposed_initializers(graph: onnx.GraphProto, inits: dict[str, TensorProto]) -> dict[str, str]:
    """Output of a 2-D Transpose of an initializer -> the initializer: the form a tied LM head takes when its
    weight is stored once (``MatMul(h, Transpose(E))`` beside ``Gather(E, ids)``)."""
    found = {}
    for node in graph.node:
        if node.op_type != "Transpose" or node.domain not in ("", "ai.onnx") or node.input[0] not in inits:
            continue
        perm = next((list(a.ints) for a in node.attribute if a.name == "perm"), [1, 0])
        if len(inits[node.input[0]].dims) == 2 and perm == [1, 0]:
            found[node.output[0]] = node.input[0]
    return found


def _drop_unread_transposes(graph: onnx.GraphProto, transposed: dict[str, str]) -> None:
    """Transposes of a table that only the quantized LM head read (it now holds the table itself)."""
    read = {name for node in graph.node for name in node.input} | {value.name for value in graph.output}
    read |= subgraph_references(graph)
    kept = [node for node in graph.node if not (node.op_type == "Transpose" and node.output[0] in transposed
                                                and node.output[0] not in read)]
    del graph.node[:]
    graph.node.extend(kept)


def _kept_because(node: onnx.NodeProto, weight: str, config: WeightOnlyConfig, read_inside: set[str]) -> str:
    if node.name in config.exclude_nodes:
        return "in exclude_nodes"
    if node.op_type == "Gather" and next((a.i for a in node.attribute if a.name == "axis"), 0) != 0:
        return "Gather on an axis other than 0"
    if weight in read_inside:
        return "its weight is also read inside a subgraph"
    return ""


def _add(graph: onnx.GraphProto, tensor: TensorProto) -> str:
    graph.initializer.append(tensor)
    return tensor.name


Lowering = Callable[[_Target, Weights, DataFile, "WeightOnlyConfig", onnx.GraphProto], list[onnx.NodeProto]]


def _matmulnbits(target: _Target, weights: Weights, out: DataFile, config: WeightOnlyConfig,
                 graph: onnx.GraphProto) -> list[onnx.NodeProto]:
    array = weights.array(target.weight)
    rows, cols = array.shape
    group = config.group_size
    float_zero = _float_zero(config, target.bits)
    if not _data_fitted(target, config) and not float_zero:
        packed, scales, zero_points = matmulnbits_tensors(array, target.bits, group, config.symmetric_weights)
    else:
        ints, block_scales, block_zeros = _fitted(array, target, group, config)
        packed, scales, zero_points = packed_matmulnbits(ints, block_scales, block_zeros, target.bits, group)
    blocks = (rows + group - 1) // group
    base = f"{target.weight}_q{target.bits}"
    inputs = [target.node.input[0],
              _add(graph, out.add(base, TensorProto.UINT8, [cols, blocks, group * target.bits // 8], packed)),
              _add(graph, out.add(f"{base}_scales", TensorProto.FLOAT, [cols * blocks], [scales]))]
    if zero_points is not None:
        zp_type, zp_dims = ((TensorProto.FLOAT, [cols * blocks]) if float_zero
                            else (TensorProto.UINT8, [cols, (blocks * target.bits + 7) // 8]))
        inputs.append(_add(graph, out.add(f"{base}_zero_points", zp_type, zp_dims, [zero_points])))
    attrs = {"K": rows, "N": cols, "bits": target.bits, "block_size": group}
    if config.accuracy_level:
        attrs["accuracy_level"] = config.accuracy_level
    return [helper.make_node("MatMulNBits", inputs, list(target.node.output), name=f"{target.node.name}_Q",
                             domain="com.microsoft", **attrs)]


def _data_fitted(target: _Target, config: WeightOnlyConfig) -> bool:
    """A MatMul whose integers GPTQ chooses or whose blocks scale estimation fits (else: round to nearest)."""
    return target.kind == "matmul" and (config.scale_estimation or (
        config.method == "gptq" and target.hessian is not None))


def _float_zero(config: WeightOnlyConfig, bits: int) -> bool:
    """Float zero points: asymmetric 4-bit MatMul blocks only (ONNX Runtime's MatMulNBits refuses them at 8 bits)."""
    return config.zero_points == "float" and not config.symmetric_weights and bits == 4


def _fitted(array: np.ndarray, target: _Target, group: int, config: WeightOnlyConfig
            ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Integers, scales and zero points [Kp, N] / [Kp/group, N] chosen on data (GPTQ) or fitted per block (scale
    estimation, float zero points), for a MatMul weight [K, N]."""
    float_zero = _float_zero(config, target.bits)
    if config.method == "gptq" and target.hessian is not None:
        return gptq(array, target.hessian, target.bits, group, config.symmetric_weights,
                    estimate=config.scale_estimation, float_zero=float_zero, act_order=config.act_order)
    importance = None if target.hessian is None else np.diag(target.hessian)
    return estimate_blocks(array, importance, target.bits, group, config.symmetric_weights, float_zero)


def _gather_block_quantized(target: _Target, weights: Weights, out: DataFile, config: WeightOnlyConfig,
                            graph: onnx.GraphProto) -> list[onnx.NodeProto]:
    """GatherBlockQuantized: int4 (signed, symmetric) or uint4 (asymmetric) data [V, H]; 8 bits as uint8 data
    with zero points (the op has no signed 8-bit form)."""
    array = weights.array(target.weight)
    group = config.group_size
    symmetric = config.symmetric_weights and target.bits == 4
    if config.scale_estimation:
        values, scales, zeros = _fitted_table(array, target.bits, group, symmetric)
    else:
        values, scales, zeros = grouped_tensors(array, 1, target.bits, group, symmetric)
    rows, cols = array.shape
    base = f"{target.weight}_q{target.bits}"
    data_type = (TensorProto.INT4 if symmetric else TensorProto.UINT4) if target.bits == 4 else TensorProto.UINT8
    inputs = [_add(graph, out.add(base, data_type, [rows, cols], values)), target.node.input[1],
              _add(graph, out.add(f"{base}_scales", TensorProto.FLOAT, [rows, -(-cols // group)], scales))]
    if zeros is not None:
        inputs.append(_add(graph, out.add(f"{base}_zero_points", data_type, [rows, -(-cols // group)], zeros)))
    return [helper.make_node("GatherBlockQuantized", inputs, list(target.node.output), name=f"{target.node.name}_Q",
                             domain="com.microsoft", bits=target.bits, block_size=group, gather_axis=0,
                             quantize_axis=1)]


def _fitted_table(array: np.ndarray, bits: int, group: int, symmetric: bool
                  ) -> tuple[list[bytes], list[bytes], list[bytes] | None]:
    """An embedding table [V, H] with fitted blocks along H (no data: every column alike), in
    ``grouped_tensors``' axis-1 layout."""
    ints, scales, zeros = estimate_blocks(array.T, None, bits, group, symmetric)
    cols = array.shape[1]
    values = np.ascontiguousarray(ints[:cols].T)  # [V, H]; H is a multiple of the block (``block_for``)
    pack = pack_int4 if bits == 4 else (lambda part: np.ascontiguousarray(part).tobytes())
    return ([pack(values)], [np.ascontiguousarray(scales.T).tobytes()],
            None if zeros is None else [pack(np.ascontiguousarray(zeros.T))])


def _dequantize_linear(target: _Target, weights: Weights, out: DataFile, config: WeightOnlyConfig,
                       graph: onnx.GraphProto) -> list[onnx.NodeProto]:
    """The opset-21 form: DequantizeLinear(q, scale, zero_point, axis, block_size) feeding the MatMul/Gather."""
    array = weights.array(target.weight)
    axis = 0 if target.kind == "matmul" else 1
    group = config.group_size  # the block chosen for this weight (``block_for``)
    if _data_fitted(target, config):
        values, scales, zeros = _fitted_grouped(array, target, group, config)
    elif config.scale_estimation:
        values, scales, zeros = _fitted_table(array, target.bits, group, config.symmetric_weights)
    else:
        values, scales, zeros = grouped_tensors(array, axis, target.bits, group, config.symmetric_weights)
    rows, cols = array.shape
    data_type = {(4, True): TensorProto.INT4, (4, False): TensorProto.UINT4,
                 (8, True): TensorProto.INT8, (8, False): TensorProto.UINT8}[(target.bits, config.symmetric_weights)]
    scale_dims = [-(-rows // group), cols] if axis == 0 else [rows, -(-cols // group)]
    base = f"{target.weight}_q{target.bits}"
    inputs = [_add(graph, out.add(base, data_type, [rows, cols], values)),
              _add(graph, out.add(f"{base}_scales", TensorProto.FLOAT, scale_dims, scales))]
    if zeros is not None:
        inputs.append(_add(graph, out.add(f"{base}_zero_points", data_type, scale_dims, zeros)))
    return _dequantized_before(target, inputs, f"{base}_dq", axis=axis, block_size=group)


def _per_channel_int8(target: _Target, weights: Weights, out: DataFile, config: WeightOnlyConfig,
                      graph: onnx.GraphProto) -> list[onnx.NodeProto]:
    """No block divides the quantized axis: int8 with one scale per output channel (a MatMul weight's column, a
    table's row) in an opset-13 DequantizeLinear with ``axis`` before the MatMul/Gather."""
    array = weights.array(target.weight)
    reduced = 0 if target.kind == "matmul" else 1
    values, scales, zeros = grouped_tensors(array, reduced, 8, array.shape[reduced], config.symmetric_weights)
    data_type = TensorProto.INT8 if config.symmetric_weights else TensorProto.UINT8
    channels = [array.shape[1 - reduced]]
    base = f"{target.weight}_q8"
    inputs = [_add(graph, out.add(base, data_type, list(array.shape), values)),
              _add(graph, out.add(f"{base}_scales", TensorProto.FLOAT, channels, scales))]
    if zeros is not None:
        inputs.append(_add(graph, out.add(f"{base}_zero_points", data_type, channels, zeros)))
    return _dequantized_before(target, inputs, f"{base}_dq", axis=1 - reduced)


def _dequantized_before(target: _Target, inputs: list[str], dequantized: str, *, axis: int,
                        block_size: int | None = None) -> list[onnx.NodeProto]:
    """A DequantizeLinear of ``inputs`` and the target's node rewired to read it instead of the float weight."""
    node = target.node
    rewired = helper.make_node(node.op_type, [node.input[0], dequantized] if target.kind == "matmul"
                               else [dequantized, node.input[1]], list(node.output), name=node.name)
    rewired.attribute.extend(node.attribute)
    blocked = {"block_size": block_size} if block_size is not None else {}
    return [helper.make_node("DequantizeLinear", inputs, [dequantized], name=f"{node.name}_DQ", axis=axis,
                             **blocked), rewired]


def _fitted_grouped(array: np.ndarray, target: _Target, group: int, config: WeightOnlyConfig
                    ) -> tuple[list[bytes], list[bytes], list[bytes] | None]:
    """GPTQ's or scale estimation's integers in the blocked DequantizeLinear layout (``grouped_tensors``' for
    axis 0); ``group`` divides K there, so there is no padding to cut."""
    ints, scales, zeros = _fitted(array, target, group, config)
    pack = pack_int4 if target.bits == 4 else (lambda values: np.ascontiguousarray(values).tobytes())
    return [pack(ints)], [np.ascontiguousarray(scales).tobytes()], None if zeros is None else [pack(zeros)]


def _lowering(config: WeightOnlyConfig, kind: str) -> Lowering:
    if config.weight_format == "dequantize_linear":
        return _dequantize_linear
    return _matmulnbits if kind == "matmul" else _gather_block_quantized


def _named(nodes: list[onnx.NodeProto], replaced: onnx.NodeProto, names: NodeNames) -> list[onnx.NodeProto]:
    """The new nodes with names no other node has (the rewired node itself keeps its name)."""
    for new in nodes:
        if new.name != replaced.name:
            new.name = names.fresh(new.name, new.op_type)
    return nodes


def quantize_file(source: Path, target: Path, config: WeightOnlyConfig,
                  feeds: Iterable[dict[str, np.ndarray]] | None = None, cache_dir: Path | None = None
                  ) -> WeightOnlyReport:
    """Quantize ``source`` (external data beside it, or inline) into ``target`` + ``target.data``; ``feeds``
    are the calibration samples that ``method: gptq``, ``ratio`` below 1 and scale estimation read; their
    statistics are shared through ``cache_dir`` (``_stats_cache``) when given."""
    model = load_model(source, load_external_data=False)  # a one-file model's weights too stay in the file
    name_nodes_uniquely(model)  # ONNX allows nameless nodes: "" + "_Q" would name every MatMulNBits alike
    names = NodeNames.of(model.graph)
    if config.weight_format == "dequantize_linear":
        model = _to_opset21(model)
    report = WeightOnlyReport()
    planned = find_targets(model, config, report)
    weights = Weights(model, source.parent)
    weights.transposed.update({one.weight: one.transposed_from for one in planned if one.transposed_from})
    if needs_data(config) and any(one.kind == "matmul" for one in planned):
        if feeds is None:
            raise ValueError(f"method {config.method} with ratio {config.ratio} needs calibration feeds")
        inputs = sorted({one.node.input[0] for one in planned if one.kind == "matmul"})
        statistics, report.statistics_reused = cached_statistics(
            source, model, inputs, feeds, lambda data: activation_hessians(source, model, inputs, data), cache_dir)
        report.calibration_samples, hessians = statistics.samples, statistics.hessians
        release_memory()  # the statistics pass's freed memory back before the weights are read
        planned = plan(planned, config, weights.array, statistics, report)
        if config.awq:
            planned, weights.row_scales, report.awq = awq_scales(
                planned, weights.array, hessians, lambda shape: matmul_block(shape, config), config.symmetric_weights)
    scalings = input_scalings(model.graph, planned, weights.row_scales)
    targets = {id(one.node): one for one in planned}
    data = DataFile(target.with_name(target.name + ".data"))
    graph = onnx.GraphProto()  # the new graph; the old one stays intact while it is read
    graph.name, graph.doc_string = model.graph.name, model.graph.doc_string
    for field_name in ("input", "output", "value_info", "sparse_initializer"):
        getattr(graph, field_name).extend(getattr(model.graph, field_name))
    opset = default_opset(model)
    try:
        for node in model.graph.node:
            if id(node) in scalings:  # awq: the input divided by its scales, before the first MatMul reading it
                graph.node.append(scalings[id(node)][0])
                graph.initializer.append(scalings[id(node)][1])
            found = targets.get(id(node))
            if found is not None and not _lower(found, weights, data, config, graph, names, report, opset):
                targets.pop(id(node))
                found = None
            if found is not None:
                weights.release(found.weight)  # written: its float pages need not stay resident
            if found is None:
                graph.node.append(node)
        _drop_unread_transposes(graph, weights.transposed)
        _carry_initializers(model.graph, graph, weights, data, {found.weight for found in targets.values()})
    finally:
        data.close()
    model.graph.CopyFrom(graph)  # small: every large tensor is external
    if config.weight_format == "matmulnbits" and not any(op.domain == "com.microsoft" for op in model.opset_import):
        model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    model.ir_version = max(model.ir_version, 10)  # int4 tensors and blocked DequantizeLinear need IR 10
    temporary = target.with_name(f".tmp-{target.name}")
    temporary.write_bytes(model.SerializeToString())
    temporary.replace(target)
    report.bytes_out = target.stat().st_size + data.path.stat().st_size
    return report


def _lower(found: _Target, weights: Weights, data: DataFile, config: WeightOnlyConfig, graph: onnx.GraphProto,
           names: NodeNames, report: WeightOnlyReport, opset: int) -> bool:
    """Write ``found``'s quantized weight and its nodes in the block ``block_for`` chooses; False (and the reason
    in ``report.kept_float``) when it stays float."""
    node = found.node
    block = block_for(found.kind, weights.dims(found.weight), config)
    if block.size is None and opset < PER_AXIS_OPSET:
        report.kept_float[node.name] = (f"no block fits its axis ({block.axis_length}) and the int8 form with a "
                                        f"scale per channel needs opset {PER_AXIS_OPSET} (the model's is {opset})")
        return False
    lowering = _per_channel_int8 if block.size is None else _lowering(config, found.kind)
    fitted = config if block.size in (None, config.group_size) else \
        config.model_copy(update={"group_size": block.size})
    graph.node.extend(_named(lowering(found, weights, data, fitted, graph), node, names))
    report.quantized[node.name] = QuantizedWeight(op=node.op_type, weight=found.weight,
                                                  bits=found.bits if block.size else 8, block_size=block.size,
                                                  method=_method_label(found, config, block.size,
                                                                      weights.row_scales))
    if block.why:
        report.blocks[found.weight] = WeightBlock(block_size=block.size, axis=block.axis_length, why=block.why)
        log.info("weight_only: %s: %s", found.weight, block.why)
    return True


def _method_label(found: _Target, config: WeightOnlyConfig, block: int | None, scaled: dict[str, np.ndarray]) -> str:
    if block is None:
        return "rtn"
    gptq_ran = found.kind == "matmul" and config.method == "gptq" and found.hessian is not None
    base = ("gptq+act_order" if config.act_order else "gptq") if gptq_ran else "rtn"
    awq = "+awq" if found.kind == "matmul" and found.weight in scaled else ""
    return base + awq + ("+scale_estimation" if config.scale_estimation else "")


def _carry_initializers(old: onnx.GraphProto, new: onnx.GraphProto, weights: Weights, data: DataFile,
                        quantized: set[str]) -> None:
    """Initializers still read go to the new graph: large or external ones copied file to file into the data
    file, small inline ones as they are; quantized weights nothing reads any more are dropped."""
    still_read = {name for node in new.node for name in node.input} | subgraph_references(new)
    for init in old.initializer:
        if init.name in quantized and init.name not in still_read:
            continue
        if init.data_location == TensorProto.EXTERNAL or len(init.raw_data) >= 1024:
            new.initializer.append(data.add(init.name, init.data_type, list(init.dims),
                                            weights.raw_pieces(init.name)))
            weights.release(init.name)
        else:
            new.initializer.append(init)


def _to_opset21(model: onnx.ModelProto) -> onnx.ModelProto:
    """The graph (weights left where they are) converted to opset 21 by onnx's version converter."""
    from onnx import version_converter

    current = default_opset(model)
    return model if current >= 21 else version_converter.convert_version(model, 21)
