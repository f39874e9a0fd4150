"""Where ptq puts its Q/DQ pairs for each runtime, decided without calibrating: what ``per_runtime: auto`` reads.

The ONNX Runtime and OpenVINO builds of one ptq config differ only in placement (``_ptq.StaticBuilder``'s
``runtime``).  Building both from placeholder ranges (the ranges change scales, never where a Q/DQ sits) and
comparing them says whether one graph serves both runtimes; it costs a preparation and two quantizer passes,
no calibration data and no inference.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from qdeploy.calibration.activations import float_tensors_of
from qdeploy.core.onnx_wire import load_model
from qdeploy.core.runtimes import RUNTIMES
from qdeploy.stages.quantize.config import PtqConfig
from qdeploy.stages.quantize.ptq._amx_convs import amx_gemm_wanted, route_convs_to_gemm
from qdeploy.stages.quantize.ptq._openvino import GRID_OPS

if TYPE_CHECKING:
    import onnx

__all__ = ["placement_differences", "quantized_placement"]

_QDQ = frozenset({"QuantizeLinear", "DequantizeLinear"})
_NONNEGATIVE_OPS = frozenset({"Relu", "Sigmoid", "HardSigmoid", "Softmax", "Softplus", "Abs", "Exp", "Sqrt",
                              "ReduceL1", "ReduceL2", "ReduceSumSquare"})
"""Ops whose output is never negative, whatever their input."""
_SIGN_KEEPING_OPS = GRID_OPS | {"Resize", "MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool",
                                "ReduceMean", "ReduceMax", "ReduceMin", "Pad"}
"""Ops whose output is never negative where their (first) input never is."""


def placement_differences(source: Path, config: PtqConfig, work_dir: Path) -> list[str]:
    """Compute nodes whose Q/DQ placement differs between the ``RUNTIMES`` builds of ``config`` on the float model
    at ``source``, or whose weights ONNX Runtime's build routes to its AMX GEMM on an AMX CPU (``_amx_convs``:
    OpenVINO needs them symmetric); sorted, empty: one graph serves both (also for a model quantized already, which
    the stage refuses: ORT's quantizer is not run on it here)."""
    # lazy: pulls onnxruntime (import cost)
    from qdeploy.stages.quantize._modes import _op_types
    from qdeploy.stages.quantize.ptq._prepare import count_quantized_nodes, excluded_nodes, prepare
    from qdeploy.stages.quantize.ptq._ptq import EVERY_SIGNED, StaticBuilder

    if count_quantized_nodes(load_model(source, load_external_data=False)):
        return []
    work_dir.mkdir(parents=True, exist_ok=True)
    prepared = prepare(source, work_dir)
    excluded, _ = excluded_nodes(prepared, config.exclude_nodes, config.exclude_patterns, config.exclude_op_types)
    op_types = _op_types(config)
    ranges = placeholder_ranges(load_model(prepared.path, load_external_data=False),
                                float_tensors_of(prepared.path, op_types))
    builds = {runtime: StaticBuilder(
        prepared.path, ranges, excluded, per_channel=config.per_channel, activation_type=config.activation_type,
        weight_type=config.weight_type, symmetric_activations=config.symmetric_activations,
        symmetric_weights=config.symmetric_weights, op_types=op_types, runtime=runtime,
        # 'measure' keeps int8 at least where a range is centred: the builds may differ there
        signed_int8=0.0 if config.signed_choice(runtime) == "asymmetric" else EVERY_SIGNED)([])
        for runtime in RUNTIMES}
    first, second = (quantized_placement(model) for model in builds.values())
    differ = {name for name in first.keys() | second.keys() if first.get(name) != second.get(name)}
    if amx_gemm_wanted("ort", []):
        differ.update(route_convs_to_gemm(builds["ort"]))
    return sorted(differ)


def placeholder_ranges(model: onnx.ModelProto, tensors: Iterable[str]) -> dict[str, tuple[float, float]]:
    """Ranges that stand in for calibrated ones: (0, 1) where the graph's structure says a tensor is never negative
    (a Relu's or Sigmoid's output, and what data movement and pooling make of such values), (-1, 1) elsewhere.

    The signs decide which activations ``signed_activations`` puts on int8; the scales never move a Q/DQ pair.
    """
    constants = {init.name: init for init in model.graph.initializer}
    nonnegative: set[str] = set()
    for node in model.graph.node:  # topological order: a node's inputs are settled before it
        if _never_negative(node, nonnegative, constants):
            nonnegative.update(node.output[:1])
    return {name: (0.0, 1.0) if name in nonnegative else (-1.0, 1.0) for name in tensors}


def _never_negative(node: onnx.NodeProto, nonnegative: set[str], constants: dict[str, onnx.TensorProto]) -> bool:
    if node.op_type in _NONNEGATIVE_OPS:
        return True
    if node.op_type == "Clip":
        low = _clip_min(node, constants)
        return low is not None and low >= 0
    if node.op_type == "Concat":
        return all(name in nonnegative for name in node.input)
    return node.op_type in _SIGN_KEEPING_OPS and bool(node.input) and node.input[0] in nonnegative


def _clip_min(node: onnx.NodeProto, constants: dict[str, onnx.TensorProto]) -> float | None:
    from onnx import numpy_helper

    for attribute in node.attribute:  # opset < 11
        if attribute.name == "min":
            return float(attribute.f)
    if len(node.input) > 1 and node.input[1] in constants:
        try:
            return float(numpy_helper.to_array(constants[node.input[1]]).min())
        except (OSError, ValueError):  # stored apart from the graph: its sign is not known here
            return None
    return None


def quantized_placement(model: onnx.ModelProto) -> dict[str, tuple[str, tuple[str, ...], tuple[bool, ...]]]:
    """Compute node name -> (op type, the integer type of each input that comes through a DequantizeLinear ('' for
    the others), which outputs go to a QuantizeLinear): where the Q/DQ pairs of a QDQ graph sit, and on which
    type, by node."""
    types = {init.name: init.data_type for init in model.graph.initializer}
    dequantized = {node.output[0]: _zero_point_type(types, node) for node in model.graph.node
                   if node.op_type == "DequantizeLinear"}
    quantized = {name for node in model.graph.node if node.op_type == "QuantizeLinear" for name in node.input[:1]}
    return {node.name: (node.op_type, tuple(dequantized.get(name, "") for name in node.input),
                        tuple(name in quantized for name in node.output))
            for node in _compute_nodes(model)}


def _zero_point_type(types: dict[str, int], dequantize: onnx.NodeProto) -> str:
    """The integer type a DequantizeLinear reads: its zero point's (uint8 where it has none, as ONNX says)."""
    from onnx import TensorProto

    if len(dequantize.input) > 2 and dequantize.input[2] in types:
        return TensorProto.DataType.Name(types[dequantize.input[2]]).lower()
    return "uint8"


def _compute_nodes(model: onnx.ModelProto) -> Iterator[onnx.NodeProto]:
    return (node for node in model.graph.node if node.op_type not in _QDQ)
