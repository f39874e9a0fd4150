"""A Concat left float reads its inputs' float values, not their dequantized copies, where OpenVINO runs the graph.

ONNX Runtime's quantizer quantizes each input of a Concat, and may leave the Concat's output float (nothing int8
reads it).  That Concat then runs float on both runtimes and its inputs' pairs only round, except that on ONNX
Runtime the pair after a Conv is also what lets the Conv run as QLinearConv.  On OpenVINO such a Concat went wrong:
YOLOv8's head (nudenet 320n, one graph for both runtimes) concatenates a box and a class convolution's quantized
outputs (uint8, zero points 49 and 255), reshapes, concatenates with the other scales' float outputs, splits and
runs a float Softmax; OpenVINO 2026.4's result at that Concat was 8.6 dB SNR from ONNX Runtime's on the same graph
(38.8 dB from the float model on ONNX Runtime), and the model's output 14.7 dB from the float model against ONNX
Runtime's 24.3.  The Concat alone, cut out of the graph, was exact: what goes wrong is in what OpenVINO makes of the
graph around it, so the rule is the pattern, not that model.

So where OpenVINO runs the graph, a Concat whose output is not quantized reads the float tensors its dequantized
inputs stand for; a pair nobody else reads goes with it.  ONNX Runtime then runs the producing Conv float (one
QLinearConv fewer per input) and the Concat's values are exact.  Edits protobuf directly (every budget build).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from qdeploy.stages.quantize.ptq._keep import remove_unused

if TYPE_CHECKING:
    import onnx

__all__ = ["float_concats_read_float"]


def float_concats_read_float(model: onnx.ModelProto) -> list[str]:
    """Rewire each float Concat's dequantized inputs to the tensors quantized (module docstring); those Concats."""
    graph = model.graph
    quantized = {node.input[0] for node in graph.node if node.op_type == "QuantizeLinear"}
    source_of = _dequantized_sources(graph)
    rewired = []
    for node in graph.node:
        if node.op_type != "Concat" or node.output[0] in quantized:
            continue
        changed = False
        for index, name in enumerate(node.input):
            if name in source_of:
                node.input[index] = source_of[name]
                changed = True
        if changed:
            rewired.append(node.name)
    if rewired:
        remove_unused(model)
    return rewired


def _dequantized_sources(graph: onnx.GraphProto) -> dict[str, str]:
    """DequantizeLinear output -> the float tensor its QuantizeLinear read, for activation pairs."""
    constants = {init.name for init in graph.initializer}
    quantize_input = {node.output[0]: node.input[0] for node in graph.node
                      if node.op_type == "QuantizeLinear" and node.input[0] not in constants}
    return {node.output[0]: quantize_input[node.input[0]] for node in graph.node
            if node.op_type == "DequantizeLinear" and node.input[0] in quantize_input}
