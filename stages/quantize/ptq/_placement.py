"""Where ptq puts its Q/DQ pairs for each runtime, decided without calibrating: what ``per_runtime: auto`` reads.

The ONNX Runtime and OpenVINO builds of one ptq config differ only in placement (``_ptq.StaticBuilder``'s
``runtime``).  Building both from placeholder ranges (the ranges change scales, never where a Q/DQ sits) and
comparing them says whether one graph serves both runtimes; it costs a preparation and two quantizer passes,
no calibration data and no inference.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from qdeploy.calibration.activations import float_tensors_of
from qdeploy.core.runtimes import RUNTIMES
from qdeploy.stages.quantize.config import PtqConfig

if TYPE_CHECKING:
    import onnx

__all__ = ["placement_differences", "quantized_placement"]

_QDQ = frozenset({"QuantizeLinear", "DequantizeLinear"})


def placement_differences(source: Path, config: PtqConfig, work_dir: Path) -> list[str]:
    """Compute nodes whose Q/DQ placement differs between the ``RUNTIMES`` builds of ``config`` on the float model
    at ``source`` (sorted; empty: one graph serves both)."""
    # lazy: pulls onnxruntime (import cost)
    from qdeploy.stages.quantize._modes import _op_types
    from qdeploy.stages.quantize.ptq._prepare import excluded_nodes, prepare
    from qdeploy.stages.quantize.ptq._ptq import StaticBuilder

    work_dir.mkdir(parents=True, exist_ok=True)
    prepared = prepare(source, work_dir)
    excluded, _ = excluded_nodes(prepared, config.exclude_nodes, config.exclude_patterns, config.exclude_op_types)
    op_types = _op_types(config)
    ranges = dict.fromkeys(float_tensors_of(prepared.path, op_types), (-1.0, 1.0))
    placed = [quantized_placement(StaticBuilder(
        prepared.path, ranges, excluded, per_channel=config.per_channel, activation_type=config.activation_type,
        weight_type=config.weight_type, symmetric_activations=config.symmetric_activations,
        symmetric_weights=config.symmetric_weights, op_types=op_types, runtime=runtime)([]))
        for runtime in RUNTIMES]
    first, second = placed
    return sorted(name for name in first.keys() | second.keys() if first.get(name) != second.get(name))


def quantized_placement(model: onnx.ModelProto) -> dict[str, tuple[str, tuple[bool, ...], tuple[bool, ...]]]:
    """Compute node name -> (op type, which inputs come through a DequantizeLinear, which outputs go to a
    QuantizeLinear): where the Q/DQ pairs of a QDQ graph sit, by node."""
    producer = {output: node.op_type for node in model.graph.node for output in node.output}
    quantized = {name for node in model.graph.node if node.op_type == "QuantizeLinear" for name in node.input[:1]}
    return {node.name: (node.op_type, tuple(producer.get(name) == "DequantizeLinear" for name in node.input),
                        tuple(name in quantized for name in node.output))
            for node in _compute_nodes(model)}


def _compute_nodes(model: onnx.ModelProto) -> Iterator[onnx.NodeProto]:
    return (node for node in model.graph.node if node.op_type not in _QDQ)
