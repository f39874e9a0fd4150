"""Int8 Q/DQ pairs around a Concat moved to uint8 in a finished QDQ graph, exactly.

OpenVINO 2026.4's CPU plugin computes a convolution that reads a Concat of int8 tensors wrongly on AVX512-VNNI CPUs
without AMX, at any zero point, and right with uint8 (``docs/int8-kernels.md``).  qdeploy's own builds place uint8
there (``_ptq.concatenated``); a graph another tool quantized (``engine: nncf``) is rewritten here.  An activation
pair QuantizeLinear(s, z) -> DequantizeLinear(s, z) with int8 ``z`` becomes the same pair with uint8 ``z + 128``:
every value it rounds to and every value it dequantizes is the same (int8's -128..127 is uint8's 0..255 shifted by
128), so ONNX Runtime computes the same outputs, and OpenVINO no longer sees int8 at the Concat.

The pairs rewritten are those whose dequantized value reaches a Concat through ops that only move data (OpenVINO's
low-precision transformations carry a dequantization through them), and those that quantize a Concat's output.

The same CPU plugin also miscomputes an int8 convolution whose int8 input reaches it through such ops (a Reshape,
Unsqueeze, Transpose or MaxPool between the dequantization and the convolution) when a Concat lies anywhere after
the convolution: basic-pitch's tf2onnx graph (Conv1D as Reshape -> Conv) lost its constant-Q transform, cosine 0.85
against 0.99 for the same QDQ file on ONNX Runtime; a four-node reproducer is right with uint8, with the
dequantization straight before the convolution, or without the Concat (``benchmarks/openvino_moved_convs.py``).
:func:`uint8_before_moved_convs` moves those pairs too.  Edits protobuf directly: one pass over the nodes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from qdeploy.graph.utils import fresh_name, node_readers
from qdeploy.stages.quantize._common import openvino_runs
from qdeploy.stages.quantize.ptq._keep import MOVER_OPS

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    import onnx

    Producers = dict[str, onnx.NodeProto]
    Readers = dict[str, list[onnx.NodeProto]]

MOVERS = (MOVER_OPS - {"Shape", "Size", "ArgMax"}) | {"Upsample", "Concat"}
"""Ops a dequantization passes through on its way to a Concat: those that move or select values, whose output holds
the values themselves (not a shape or an index)."""
CONCAT_INT8_BUG = "OpenVINO miscomputes a convolution reading a Concat of int8 tensors on VNNI CPUs without AMX"
"""Why int8 stays away from a Concat, in the report's words."""


MOVED_CONV_INT8_BUG = ("OpenVINO miscomputes an int8 convolution whose int8 input passes through a Reshape, Transpose "
                       "or pooling first when a Concat follows it")
"""Why int8 stays away from such a convolution's input, in the report's words."""


def moved_where_openvino_runs(model: onnx.ModelProto, variant: str, targets: tuple[str, ...]) -> str | None:
    """:func:`uint8_at_concats` and :func:`uint8_before_moved_convs` where OpenVINO may run the graph; the
    report's note (None: nothing moved)."""
    if not openvino_runs(variant, targets):
        return None
    concats, convs = uint8_at_concats(model), uint8_before_moved_convs(model)
    said = [f"{concats} int8 activation pairs at Concats moved to uint8, exactly: {CONCAT_INT8_BUG}"] if concats else []
    return "; ".join([*said, *([moved_convs_note(convs)] if convs else [])]) or None


def moved_convs_note(pairs: int) -> str:
    """The report's words for what :func:`uint8_before_moved_convs` moved."""
    return (f"{pairs} int8 activation pairs before convolutions reached through data movement moved to uint8, "
            f"exactly: {MOVED_CONV_INT8_BUG}")


def uint8_at_concats(model: onnx.ModelProto) -> int:
    """Rewrite the int8 activation pairs that reach or leave a Concat to uint8 (exact); how many pairs."""
    return _rewrite(model, lambda graph, producer, readers: [
        node for concat in graph.node if concat.op_type == "Concat"
        for node in (*_upstream(concat, producer), *_downstream(concat, readers))])


def uint8_before_moved_convs(model: onnx.ModelProto) -> int:
    """Rewrite the int8 activation pairs whose dequantized value reaches the data input of a Conv of group 1 through
    at least one mover, where a Concat follows that Conv (the module's second bug), to uint8 (exact); how many
    pairs."""
    def convs_inputs(graph: onnx.GraphProto, producer: Producers, readers: Readers) -> list[onnx.NodeProto]:
        before_concat = _reaching_concats(graph.node, producer)
        return [node for conv in graph.node if conv.op_type == "Conv" and id(conv) in before_concat
                and _ungrouped(conv) for node in _through_movers(conv, producer)]

    return _rewrite(model, convs_inputs)


def _rewrite(model: onnx.ModelProto,
             pick: Callable[[onnx.GraphProto, Producers, Readers], list[onnx.NodeProto]]) -> int:
    """Move the pairs whose QuantizeLinear nodes ``pick`` names (each once) to uint8; how many moved."""
    graph = model.graph
    producer = {out: node for node in graph.node for out in node.output if out}
    readers = node_readers(graph.node)
    quantizers = {id(node): node for node in pick(graph, producer, readers)}
    initializers = {init.name: init for init in graph.initializer}
    taken = set(initializers) | set(producer) | {value.name for value in graph.input}
    return sum(_to_uint8(node, readers, initializers, graph, taken) for node in quantizers.values())


def _ungrouped(conv: onnx.NodeProto) -> bool:
    """A convolution of group 1: a depthwise one (and a MatMul) read the same way computed right."""
    return all(attribute.i == 1 for attribute in conv.attribute if attribute.name == "group")


def _reaching_concats(nodes: Iterable[onnx.NodeProto], producer: dict[str, onnx.NodeProto]) -> set[int]:
    """The nodes (ids) a Concat is computed from, directly or not."""
    seen: set[int] = set()
    pending = [name for node in nodes if node.op_type == "Concat" for name in node.input]
    while pending:
        node = producer.get(pending.pop())
        if node is not None and id(node) not in seen:
            seen.add(id(node))
            pending.extend(name for name in node.input if name)
    return seen


def _through_movers(conv: onnx.NodeProto, producer: dict[str, onnx.NodeProto]) -> list[onnx.NodeProto]:
    """The QuantizeLinear of the activation pair whose dequantized value reaches ``conv``'s data input through one
    mover or more (none: a dequantization read straight by the convolution is computed right, and OpenVINO drops
    an Identity)."""
    node, moved = producer.get(conv.input[0]) if conv.input else None, False
    while node is not None and node.op_type in MOVERS and node.op_type not in ("Concat", "Identity"):
        node, moved = producer.get(node.input[0]) if node.input else None, True
    if not moved or node is None or node.op_type != "DequantizeLinear":
        return []
    source = producer.get(node.input[0])
    return [source] if source is not None and source.op_type == "QuantizeLinear" else []


def _upstream(concat: onnx.NodeProto, producer: dict[str, onnx.NodeProto]) -> list[onnx.NodeProto]:
    """The QuantizeLinear of each activation pair whose dequantized value reaches ``concat`` through movers."""
    found, pending, seen = [], list(concat.input), set()
    while pending:
        node = producer.get(pending.pop())
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        if node.op_type == "DequantizeLinear":
            source = producer.get(node.input[0])
            if source is not None and source.op_type == "QuantizeLinear":
                found.append(source)
        elif node.op_type in MOVERS:
            pending.extend(name for name in node.input[:1] if name)
    return found


def _downstream(concat: onnx.NodeProto, readers: dict[str, list[onnx.NodeProto]]) -> list[onnx.NodeProto]:
    """The QuantizeLinear nodes that quantize ``concat``'s output (directly or through movers)."""
    found, pending, seen = [], list(concat.output), set()
    while pending:
        for node in readers.get(pending.pop(), []):
            if id(node) in seen:
                continue
            seen.add(id(node))
            if node.op_type == "QuantizeLinear":
                found.append(node)
            elif node.op_type in MOVERS and node.op_type != "Concat":
                pending.extend(node.output)
    return found


def _to_uint8(quantize: onnx.NodeProto, readers: dict[str, list[onnx.NodeProto]],
              initializers: dict[str, onnx.TensorProto], graph: onnx.GraphProto, taken: set[str]) -> int:
    """Move one pair to uint8 (1), or leave it (0): not int8, or its output read by anything but dequantizations
    with the same scale and zero point."""
    import numpy as np
    import onnx
    from onnx import numpy_helper

    if len(quantize.input) < 3 or quantize.input[2] not in initializers:
        return 0
    zero_point = numpy_helper.to_array(initializers[quantize.input[2]])
    dequantizers = readers.get(quantize.output[0], [])
    pairs = all(node.op_type == "DequantizeLinear" and len(node.input) == 3
                and all(_same(initializers, node.input[index], quantize.input[index]) for index in (1, 2))
                for node in dequantizers)
    if zero_point.dtype != np.int8 or not dequantizers or not pairs:
        return 0
    shifted = (zero_point.astype(np.int16) + 128).astype(np.uint8)
    name = fresh_name(f"{quantize.input[2]}_uint8", taken)
    taken.add(name)
    graph.initializer.append(numpy_helper.from_array(shifted, name))
    initializers[name] = graph.initializer[-1]
    for node in (quantize, *dequantizers):
        node.input[2] = name
    for value in (*graph.value_info, *graph.output):  # a declared int8 type of the quantized tensor follows
        if value.name == quantize.output[0] and value.type.HasField("tensor_type"):
            value.type.tensor_type.elem_type = onnx.TensorProto.UINT8
    return 1


def _same(initializers: dict[str, onnx.TensorProto], first: str, second: str) -> bool:
    from onnx import numpy_helper

    if first == second:
        return True
    if first not in initializers or second not in initializers:
        return False
    a, b = (numpy_helper.to_array(initializers[name]) for name in (first, second))
    return a.dtype == b.dtype and a.shape == b.shape and bool((a == b).all())
