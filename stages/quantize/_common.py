"""What the quantize stage's entry point and its modes share: the 7-bit choice, counts, the load check."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from qdeploy.core.context import StageContext
from qdeploy.core.errors import StageError
from qdeploy.core.runtimes import runtime_of_target, runtime_of_variant
from qdeploy.graph.external_data import save_onnx
from qdeploy.stages.quantize.config import STAGE, DynamicConfig, ModeConfig, NncfPtqConfig, PtqConfig
from qdeploy.stages.quantize.ptq._prepare import (
    QUANTIZED_OP_TYPES,
)
from qdeploy.targets.int8_path import CPU_TARGETS
from qdeploy.targets.ort_probe import load_error

if TYPE_CHECKING:
    import onnx


__all__ = [
    "SevenBit",
    "check_runs",
    "nothing_quantized",
    "openvino_only",
    "openvino_runs",
    "quantized_node_counts",
    "resolve_reduce_range",
    "save_stage_model",
    "saved_path",
]

SevenBit = Literal["none", "weights", "activations", "choose"]


def resolve_reduce_range(config: PtqConfig | DynamicConfig | NncfPtqConfig,
                         targets: tuple[str, ...]) -> tuple[SevenBit, str]:
    """Which operand gets 7 bits ('choose': measure both), and why; from the recipe's targets, never the build CPU."""
    setting = config.reduce_range
    if setting == "auto":
        return _auto_reduce_range(config, targets, [target for target in targets if target in CPU_TARGETS])
    if setting in ("weights", "activations"):
        return setting, "set in the recipe"
    return ("weights" if setting else "none"), "set in the recipe"


def _auto_reduce_range(config: PtqConfig | DynamicConfig | NncfPtqConfig, targets: tuple[str, ...],
                       cpu: list[str]) -> tuple[SevenBit, str]:
    if not isinstance(config, NncfPtqConfig) and config.weight_type == "uint8":
        return "none", "auto: uint8 weights (U8U8 kernels) do not saturate"
    if targets and not cpu:
        return "none", f"auto: no CPU target among {', '.join(targets)}"
    why = (f"auto: built for {', '.join(cpu) if cpu else 'unknown targets'}; x86 CPUs without VNNI saturate "
           "full-range int8, 7-bit operands are exact on every x86 CPU")
    if isinstance(config, PtqConfig) and config.activation_type == "uint8":
        return "choose", why
    return "weights", why


def openvino_only(variant: str, targets: tuple[str, ...]) -> bool:
    """Whether the artifact runs on OpenVINO alone: built for it (``int8@openvino``), or every target it is built for
    is OpenVINO's; False for unknown targets.  OpenVINO's convolutions (oneDNN) halve the weights for an int8 input on
    x86 CPUs without VNNI rather than saturate, so there a convolution's signed input keeps 8 bits beside 7-bit
    unsigned activations (``_ptq.convolution_inputs``); ONNX Runtime's kernels shift int8 inputs to uint8, and 8 bits
    would saturate."""
    if runtime_of_variant(variant) == "openvino":
        return True
    return bool(targets) and all(runtime_of_target(target) == "openvino" for target in targets)


def openvino_runs(variant: str, targets: tuple[str, ...]) -> bool:
    """Whether OpenVINO may run the artifact: built for it, or built for every target and one of them is
    OpenVINO's."""
    runtime = runtime_of_variant(variant)
    if runtime is not None:
        return runtime == "openvino"
    return any(runtime_of_target(target) == "openvino" for target in targets)


# Which float ops run in integer once their inputs are dequantized, after ONNX Runtime's QDQ node groups
# (qdq_selector_action_transformer.cc): op -> (inputs that must come from a DequantizeLinear, whether every reader
# of the output must be a QuantizeLinear).  Other ops (Tanh, Relu, LayerNormalization...) run in float on the
# dequantized values: a Tanh between two quantized Convs reads a DequantizeLinear and is still float.
_EVERY_INPUT = None
_QDQ_GROUPS: dict[str, tuple[tuple[int, ...] | None, bool]] = {
    **{op: ((0, 1), False) for op in ("MatMul", "Gemm")},  # no Q after: MatMulIntegerToFloat / QGemm, float out
    "Conv": ((0, 1), False),  # ORT wants a Q after it for QLinearConv; OpenVINO runs it int8 without
    **{op: ((0,), True) for op in ("AveragePool", "GlobalAveragePool", "LeakyRelu", "Sigmoid", "Softmax",
                                   "Gather", "Reshape", "Transpose", "Squeeze", "Unsqueeze", "MaxPool", "Resize",
                                   "Split")},
    **{op: ((0, 1), True) for op in ("Add", "Mul")},
    "Where": ((1, 2), True),
    "Concat": (_EVERY_INPUT, True),
    "ArgMax": ((0,), False),
}
_QDQ_OPS = {"QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear"}


def quantized_node_counts(model: onnx.ModelProto) -> dict[str, int]:
    """Per op type, the nodes that run in integer: integer ops (QLinear*, MatMulInteger, ConvInteger,
    MatMulNBits...), and float ops of a QDQ node group: an integer-capable op whose quantized inputs all come from
    a DequantizeLinear (and whose output goes only to QuantizeLinear where the runtime needs that).  An excluded
    Conv with float weights, or a Sigmoid/Tanh reading a dequantized tensor in float, does not count."""
    graph = model.graph
    dequantized = {out for node in graph.node if node.op_type == "DequantizeLinear" for out in node.output}
    readers: dict[str, list[str]] = {}
    for node in graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node.op_type)
    graph_outputs = {value.name for value in graph.output}
    counts: Counter[str] = Counter()
    for node in graph.node:
        if node.op_type in _QDQ_OPS:
            continue
        if node.op_type in QUANTIZED_OP_TYPES or node.op_type.startswith(("QLinear", "QOrdered")) or \
                _in_qdq_group(node, dequantized, readers, graph_outputs):
            counts[node.op_type] += 1
    return dict(sorted(counts.items()))


def _in_qdq_group(node: onnx.NodeProto, dequantized: set[str], readers: dict[str, list[str]],
                  graph_outputs: set[str]) -> bool:
    if node.op_type not in _QDQ_GROUPS:
        return False
    positions, needs_q_after = _QDQ_GROUPS[node.op_type]
    inputs = [name for name in node.input if name] if positions is None else \
        [node.input[i] for i in positions if i < len(node.input) and node.input[i]]
    if not inputs or not all(name in dequantized for name in inputs):
        return False
    if not needs_q_after:
        return True
    outputs = [name for name in node.output if name]
    return bool(outputs) and all(name not in graph_outputs and readers.get(name)
                                 and all(op == "QuantizeLinear" for op in readers[name]) for name in outputs)


def check_runs(output: Path, config: ModeConfig, ctx: StageContext) -> None:
    """The quantized model must load in ONNX Runtime's CPU provider with its default session options, in a child
    process (``ort_probe``): a crash in ONNX Runtime's graph optimisations fails this variant, not the run."""
    error = load_error(output)
    if error is None:
        return
    hint = ""
    if isinstance(config, DynamicConfig) and "ConvInteger" in error:
        hint = "; this ONNX Runtime lacks a ConvInteger kernel for these types: try weight_type uint8 or " \
               "op_types [MatMul, Gemm]"
    elif "crashed" in error:
        hint = "; exclude_nodes keeps nodes float, if some are known to be involved"
    raise StageError(STAGE, ctx.variant, f"the quantized model does not load in ONNX Runtime: {error}{hint}")


def save_stage_model(model: onnx.ModelProto, path: Path) -> Path:
    save_onnx(model, path)  # a large model's weights move to the data file: the proto no longer holds them
    return path


def saved_path(model: onnx.ModelProto, path: Path) -> Path | None:
    """The saved file when the model's weights now live in its external data (the runner adopts it)."""
    from onnx.external_data_helper import _get_all_tensors, uses_external_data

    return path if any(uses_external_data(tensor) for tensor in _get_all_tensors(model)) else None


def nothing_quantized(config: PtqConfig | DynamicConfig, nodes: dict[str, str], op_types: list[str]) -> str:
    """Why a build quantized no node (``nodes``: name -> op type), and what to do: an "int8" artifact that is the
    float model is no result."""
    present = Counter(nodes.values())
    said = ", ".join(f"{op} {count}" for op, count in present.most_common(8))
    hint = "set op_types to op types the model has, or drop the quantize step"
    if isinstance(config, DynamicConfig) and present.get("Conv") and config.weight_type == "int8":
        hint = ("dynamic mode leaves Conv out with int8 weights (ONNX Runtime has no int8-weight ConvInteger): "
                "use mode ptq for a convolutional model, or weight_type uint8")
    return (f"nothing was quantized: no node of the op types mode {config.mode} quantizes here "
            f"({', '.join(op_types)}) could be (the model's ops: {said}); {hint}")
