"""What the quantize stage's entry point and its modes share: the 7-bit choice, counts, the load check."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from qdeploy.core.context import StageContext
from qdeploy.core.errors import StageError
from qdeploy.stages.quantize._prepare import (
    QUANTIZED_OP_TYPES,
)
from qdeploy.stages.quantize.config import (
    _FLOAT_TYPES,
    STAGE,
    QuantizeConfig,
)

if TYPE_CHECKING:
    import onnx


__all__ = ["SevenBit", "check_runs", "quantized_node_counts", "resolve_reduce_range"]

SevenBit = Literal["none", "weights", "activations", "choose"]


def resolve_reduce_range(config: QuantizeConfig, targets: tuple[str, ...]) -> tuple[SevenBit, str]:
    """Which operand gets 7 bits ('choose': measure both), and why; from the recipe's targets, never the build CPU."""
    from qdeploy.targets.int8_path import CPU_TARGETS

    setting = config.reduce_range
    if setting == "auto":
        return _auto_reduce_range(config, targets, [target for target in targets if target in CPU_TARGETS])
    if setting in ("weights", "activations"):
        return setting, "set in the recipe"
    return ("weights" if setting else "none"), "set in the recipe"


def _auto_reduce_range(config: QuantizeConfig, targets: tuple[str, ...], cpu: list[str]) -> tuple[SevenBit, str]:
    if config.weight_type == "uint8":
        return "none", "auto: uint8 weights (U8U8 kernels) do not saturate"
    if targets and not cpu:
        return "none", f"auto: no CPU target among {', '.join(targets)}"
    why = (f"auto: built for {', '.join(cpu) if cpu else 'unknown targets'}; x86 CPUs without VNNI saturate "
           "full-range int8, 7-bit operands are exact on every x86 CPU")
    if config.mode == "ptq" and config.activation_type == "uint8":
        return "choose", why
    return "weights", why


def quantized_node_counts(model: onnx.ModelProto) -> dict[str, int]:
    """Per op type, the nodes that run quantized: integer ops, or nodes fed by a DequantizeLinear whose
    constant inputs are not left in float (an excluded Conv fed by a quantized activation does not count)."""
    dequantized = {out for node in model.graph.node if node.op_type == "DequantizeLinear" for out in node.output}
    float_constants = {init.name for init in model.graph.initializer if init.data_type in _FLOAT_TYPES}
    float_constants |= {out for node in model.graph.node if node.op_type == "Constant" for out in node.output}
    counts: Counter[str] = Counter()
    for node in model.graph.node:
        if node.op_type in {"QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear"}:
            continue
        fed = any(name in dequantized for name in node.input)
        if node.op_type in QUANTIZED_OP_TYPES or (fed and not float_constants & set(node.input)):
            counts[node.op_type] += 1
    return dict(sorted(counts.items()))


def check_runs(output: Path, config: QuantizeConfig, ctx: StageContext) -> None:
    """The quantized model must load in ONNX Runtime's CPU provider."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    try:
        ort.InferenceSession(str(output), options, providers=["CPUExecutionProvider"])
    except Exception as exc:
        hint = ""
        if config.mode == "dynamic" and "ConvInteger" in str(exc):
            hint = "; this ONNX Runtime lacks a ConvInteger kernel for these types: try weight_type uint8 or " \
                   "op_types [MatMul, Gemm]"
        raise StageError(STAGE, ctx.variant, f"the quantized model does not load in ONNX Runtime: {exc}{hint}") from exc
