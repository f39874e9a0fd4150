"""Q/DQ placement for OpenVINO (``runtime: openvino``): no requantization OpenVINO would run as a kernel of its own.

Profiled per layer on YOLOX (``get_profiling_info``), ONNX Runtime's placement costs OpenVINO three things
NNCF's does not:

- **Concat requantizes.**  ORT quantizes each Concat input with its own range and the output with another, so
  OpenVINO runs one Convert-Subtract-FakeQuantize kernel per input (33 on YOLOX).  Here a Concat's inputs and
  output share one range (the union: no value is clipped), as NNCF's unified scales do;
- **exact Q/DQ pairs stay.**  With one grid for a Concat's inputs, the QuantizeLinear after it (and after
  MaxPool, Reshape, Transpose... of a value already on that grid) rounds nothing, yet OpenVINO still runs it.
  Such pairs are removed (:func:`drop_exact_requantization`): OpenVINO carries the dequantization through
  those ops into the int8 convolution that reads them, and ONNX Runtime computes the same values;
- **attention is quantized.**  OpenVINO runs a MatMul of two activations (attention scores, context) float in
  its attention kernel; the Q/DQ ORT puts before it cost MiniLM six Convert, six Subtract and a Transpose in u8
  per run.  Those MatMuls stay float (:func:`activation_matmuls`), as NNCF's transformer preset leaves them;
- **the tail is quantized.**  Data movement after the last compute node (a detection head's Concat/Reshape/
  Transpose to the output) gets Q/DQ that no int8 kernel reads: it costs kernels and puts the graph output on
  an 8-bit grid shared by box coordinates and scores.  Those nodes stay float (:func:`float_tail`).

Edits protobuf directly: it runs on every build the accuracy budget makes (linear in the model's size).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from qdeploy.graph.utils import node_readers
from qdeploy.stages.quantize.ptq._keep import MOVER_OPS, QDQ_OPS, remove_unused

if TYPE_CHECKING:
    from collections.abc import Callable, Container

    import onnx

COMPUTE_OPS = frozenset({"Conv", "ConvTranspose", "MatMul", "Gemm"})
GRID_OPS = frozenset({
    "Concat", "MaxPool", "Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "Slice", "Split",
    "Identity", "DepthToSpace", "SpaceToDepth",
})
"""Ops whose outputs hold only input values (Concat: of all inputs), which OpenVINO carries a dequantization
through.  Resize in nearest mode too (``_keeps_grid``)."""
_SAME_RANGE_OPS = GRID_OPS | {"Resize"}
"""ORT quantizes these ops' outputs with their input's parameters: they join their input's range group."""
SHARED_PARAMETER_OPS = _SAME_RANGE_OPS | {"AveragePool", "Pad", "Gather", "GatherElements"}
"""With the ops ORT's QDQ registry also gives their input's parameters, which the range groups do not join."""


def unify_concat_ranges(model: onnx.ModelProto, ranges: dict[str, tuple[float, float]],
                        op_types: list[str], skip: Container[str] = ()) -> dict[str, tuple[float, float]]:
    """``ranges`` with each Concat's inputs and output (and what reaches them through data movement) on one range,
    the union of theirs; Concats named in ``skip`` (left float) join nothing."""
    unified = dict(ranges)
    for members in concat_groups(model, op_types, among=ranges, skip=skip):
        low = min(ranges[name][0] for name in members)
        high = max(ranges[name][1] for name in members)
        unified.update(dict.fromkeys(members, (low, high)))
    return unified


def concat_groups(model: onnx.ModelProto, op_types: list[str], linking: frozenset[str] = _SAME_RANGE_OPS,
                  among: Container[str] | None = None, skip: Container[str] = ()) -> list[list[str]]:
    """The tensors that share one quantization with a Concat, a list per Concat: its inputs and output, and what ORT's
    quantizer links to them through an op of ``linking`` (it quantizes such an op's output with its input's
    parameters).  Only ops in ``op_types`` (those it quantizes) link, and no node named in ``skip``; only tensors in
    ``among`` count (all when None)."""
    if "Concat" not in op_types:
        return []
    parent: dict[str, str] = {}

    def root(name: str) -> str:
        while parent.setdefault(name, name) != name:
            parent[name] = parent[parent[name]]
            name = parent[name]
        return name

    for node in model.graph.node:
        if node.op_type not in op_types or node.name in skip:
            continue
        linked = [*node.input, *node.output] if node.op_type == "Concat" else \
            [node.input[0], node.output[0]] if node.op_type in linking and node.input else []
        linked = [name for name in linked if name and (among is None or name in among)]
        for name in linked[1:]:
            parent[root(name)] = root(linked[0])
    concat_outputs = {node.output[0] for node in model.graph.node if node.op_type == "Concat"}
    groups: dict[str, list[str]] = {}
    for name in list(parent):
        groups.setdefault(root(name), []).append(name)
    return [members for members in groups.values() if len(members) > 1 and concat_outputs.intersection(members)]


def pooled_before_quantizing(model: onnx.ModelProto, op_types: list[str], excluded: list[str]) -> set[str]:
    """MaxPool nodes whose input is to be quantized in front of them, not after them.

    ONNX Runtime's quantizer quantizes a MaxPool only where its input is already quantized; after a Conv -> Relu
    it is not, so the Q lands after the MaxPool and OpenVINO runs Conv (int8) -> MaxPool (bf16/f32) -> a
    FakeQuantize kernel: on ResNet-18 (AMX) the stem's pool cost 162 us that way against 64 us as an int8 MaxPool
    reading the Conv's quantized output, as NNCF places it.  The pair after such a MaxPool then rounds nothing and
    :func:`drop_exact_requantization` removes it.
    """
    skip = set(excluded)
    return {node.name for node in model.graph.node
            if node.op_type == "MaxPool" and "MaxPool" in op_types and node.name not in skip}


def float_tail(model: onnx.ModelProto, op_types: list[str], excluded: Container[str] = ()) -> list[str]:
    """Nodes of the quantized op types from which no compute node can be reached: nothing int8 reads them.

    Also data movement whose output reaches compute only through a float op (a Keras text CNN's Dense -> Reshape ->
    Pad -> element-wise Max, an embedding lookup -> BatchNormalization's Mul): its Q/DQ pair only rounds, and
    OpenVINO runs it as a FakeQuantize and a zero-point Subtract of their own (22 pairs on the text CNN).  A
    Concat counts as data movement here: YOLOv8's head concatenates its box and class convolutions' outputs,
    then reaches the DFL convolution only through a float Softmax; quantized, those outputs made OpenVINO's
    result 9.8 dB SNR from the float model where ONNX Runtime's, on the same graph, was 24.7 dB.  A
    Gather from a constant table keeps its pair: it is how the table is stored in 8 bits."""
    readers = node_readers(model.graph.node)
    constants = {init.name for init in model.graph.initializer}
    feeds_compute = reaching_compute(model, readers, lambda node: True)
    feeds_int8 = _feeding_int8(model, readers, op_types, excluded)
    return [node.name for node in model.graph.node
            if node.op_type in op_types and node.op_type not in COMPUTE_OPS
            and (node.name not in feeds_compute or (_only_moves(node, constants) and node.name not in feeds_int8))]


def _only_moves(node: onnx.NodeProto, constants: set[str]) -> bool:
    """Data movement, a Concat of activations included: it adds no rounding of its own where it stays float."""
    return _moves_data(node, constants) or (node.op_type == "Concat" and bool(node.input))


_ACTIVATIONS = frozenset({"Relu", "Clip", "LeakyRelu"})
_SAME_VALUES = frozenset({"Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "Identity", "DepthToSpace",
                          "SpaceToDepth", "Expand", "Tile"})
"""Movement whose output holds exactly its input's values: quantizing before it rounds on the same range (a Slice's
or Split's part may span less)."""


def moved_before_quantizing(model: onnx.ModelProto, op_types: list[str], excluded: Container[str] = ()) -> set[str]:
    """Data movement between a ReLU-like activation and int8 compute, whose input is to be quantized in front of it.

    ORT's quantizer quantizes a Transpose or Reshape only where its input is already quantized; after a Relu that
    follows a float Add it is not, so the Q lands after the movement (a Keras Conv1D -> Squeeze -> bias Add ->
    Relu -> Transpose -> Reshape -> Dense): OpenVINO then runs the Add, the Relu and the Transpose in bf16 instead
    of fusing them into the int8 convolution with the Q as its output, and the Transpose on bytes, as NNCF's
    placement lets it.  The values are the same: movement does not change them.  Only after an activation
    (Relu, Clip, LeakyRelu), and only where every reader of the input is int8 too (a float reader would read the
    rounded values): a Q moved onto a residual Add's output instead changed what OpenVINO computes there (PP-OCRv4
    rec's mean cosine 0.950 -> 0.944 on OpenVINO f32; ONNX Runtime's outputs were the same)."""
    constants = {init.name for init in model.graph.initializer}
    readers = node_readers(model.graph.node)
    feeds_int8 = _feeding_int8(model, readers, op_types, excluded)
    after_activation = {out for node in model.graph.node if node.op_type in _ACTIVATIONS for out in node.output}
    moved: set[str] = set()
    for node in model.graph.node:  # topological order: a chain of movers after the activation moves whole
        if node.name in feeds_int8 and node.op_type in _SAME_VALUES and _moves_data(node, constants) \
                and node.input[0] in after_activation \
                and all(reader.name in feeds_int8 for reader in readers.get(node.input[0], [])):
            moved.add(node.name)
            after_activation.update(node.output)
    return moved


def reaching_compute(model: onnx.ModelProto, readers: dict[str, list[onnx.NodeProto]],
                     counts: Callable[[onnx.NodeProto], bool]) -> set[str]:
    """Nodes that ``counts`` and from which a compute node that ``counts`` is reached through such nodes only."""
    found: set[str] = set()
    for node in reversed(model.graph.node):  # topological order: readers are settled first
        if counts(node) and (node.op_type in COMPUTE_OPS or any(reader.name in found for out in node.output
                                                                for reader in readers.get(out, []))):
            found.add(node.name)
    return found


def _feeding_int8(model: onnx.ModelProto, readers: dict[str, list[onnx.NodeProto]], op_types: list[str],
                  excluded: Container[str]) -> set[str]:
    """Quantized nodes from which a quantized compute node is reached through quantized nodes only."""
    return reaching_compute(model, readers, lambda node: node.op_type in op_types and node.name not in excluded)


def _moves_data(node: onnx.NodeProto, constants: set[str]) -> bool:
    """Data movement of an activation (not MaxPool: OpenVINO pools int8 faster where it reads a convolution; not a
    Gather from a constant table: that pair is how the table is stored in 8 bits)."""
    return node.op_type in MOVER_OPS and node.op_type != "MaxPool" and bool(node.input) \
        and node.input[0] not in constants


def activation_matmuls(model: onnx.ModelProto) -> list[str]:
    """MatMuls of two activations (attention's scores and context): OpenVINO runs them float whatever their inputs
    (in its fused attention kernel), so Q/DQ in front of them only adds Convert/Subtract/FakeQuantize kernels."""
    constants = {init.name for init in model.graph.initializer}
    constants |= {out for node in model.graph.node if node.op_type == "Constant" for out in node.output}
    return [node.name for node in model.graph.node
            if node.op_type == "MatMul" and not any(name in constants for name in node.input)]


def drop_exact_requantization(model: onnx.ModelProto) -> int:
    """Remove QuantizeLinear -> DequantizeLinear pairs that round nothing: on a tensor that data movement (or a
    Concat) made of values already dequantized with the same scale and zero point.  How many were removed."""
    graph = model.graph
    constants = {init.name: init for init in graph.initializer}
    readers = node_readers(graph.node)
    outputs = {value.name for value in graph.output}
    grid: dict[str, bytes] = {}  # tensor -> the parameters of the grid its values lie on
    dropped = 0
    for node in graph.node:
        if node.op_type == "DequantizeLinear":
            key = _parameters(node, constants)
            if key is not None:
                grid[node.output[0]] = key
        elif node.op_type == "QuantizeLinear":
            dropped += _drop_if_exact(node, grid, constants, readers, outputs)
        elif _keeps_grid(node):
            data = [name for name in node.input[:_data_inputs(node)] if name]
            keys = {grid.get(name) for name in data}
            if data and len(keys) == 1 and None not in keys:
                grid.update(dict.fromkeys((out for out in node.output if out), keys.pop()))
    if dropped:
        remove_unused(model)
    return dropped


def _drop_if_exact(quantize: onnx.NodeProto, grid: dict[str, bytes], constants: dict[str, onnx.TensorProto],
                   readers: dict[str, list[onnx.NodeProto]], outputs: set[str]) -> int:
    """Rewire the readers of a QuantizeLinear's dequantizations to its input when the pair is exact."""
    source = quantize.input[0]
    key = _parameters(quantize, constants)
    if key is None or grid.get(source) != key or source in outputs or quantize.output[0] in outputs:
        return 0
    dequantizations = readers.get(quantize.output[0], [])
    if not dequantizations or any(node.op_type != "DequantizeLinear" or _parameters(node, constants) != key
                                  or node.output[0] in outputs for node in dequantizations):
        return 0
    # a QDQ reader of the dequantized value (another Q) would see the same tensor: rewiring keeps it valid
    for dequantize in dequantizations:
        for reader in readers.get(dequantize.output[0], []):
            for index, name in enumerate(reader.input):
                if name == dequantize.output[0]:
                    reader.input[index] = source
            readers.setdefault(source, []).append(reader)
    return 1


def dequantized_values(model: onnx.ModelProto) -> set[str]:
    """Tensors holding dequantized values: DequantizeLinear outputs, and what data movement makes of them only
    (OpenVINO carries the dequantization through to the compute node reading them)."""
    found: set[str] = set()
    for node in model.graph.node:  # topological order
        data = [name for name in node.input[:_data_inputs(node)] if name]
        if node.op_type == "DequantizeLinear" or (_keeps_grid(node) and data and all(name in found for name in data)):
            found.update(out for out in node.output if out)
    return found


def _keeps_grid(node: onnx.NodeProto) -> bool:
    if node.op_type == "Resize":
        mode = next((attr.s for attr in node.attribute if attr.name == "mode"), b"nearest")
        return mode == b"nearest"
    return node.op_type in GRID_OPS and node.op_type not in QDQ_OPS


def _data_inputs(node: onnx.NodeProto) -> int:
    """How many leading inputs carry values (the rest are shapes, indices, sizes)."""
    return len(node.input) if node.op_type == "Concat" else 1


def _parameters(node: onnx.NodeProto, constants: dict[str, onnx.TensorProto]) -> bytes | None:
    """A Q/DQ node's scale, zero point (value and type) and axis as one comparable key; None when not constant."""
    from onnx import numpy_helper

    scale = constants.get(node.input[1]) if len(node.input) > 1 else None
    zero = constants.get(node.input[2]) if len(node.input) > 2 and node.input[2] else None
    if scale is None or (len(node.input) > 2 and node.input[2] and zero is None):
        return None
    # the axis matters only for per-channel parameters
    axis = next((attr.i for attr in node.attribute if attr.name == "axis"), 1) if scale.dims else None
    parts = [numpy_helper.to_array(scale).tobytes(), bytes(str(list(scale.dims)), "ascii")]
    if zero is not None:
        parts += [numpy_helper.to_array(zero).tobytes(), bytes(str(zero.data_type), "ascii")]
    return b"|".join([*parts, bytes(str(axis), "ascii")])
