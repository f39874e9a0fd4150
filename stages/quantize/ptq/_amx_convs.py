"""ONNX Runtime's int8 convolutions on AMX: which kernel a Conv gets is chosen by its weights' zero point.

ONNX Runtime's ``QLinearConv`` (what its QDQ fusion makes of DQ -> Conv -> Q) runs int8 weights whose zero
points are all 0 on MLAS's symmetric convolution kernels (``MlasConvSym``: AVX2, AVX-VNNI, AVX512-VNNI; none
uses AMX), and any other weights as im2col + its int8 GEMM, which runs on AMX tiles on CPUs with AMX-INT8.
qdeploy's symmetric weights (zero point 0) therefore keep every int8 convolution off AMX.

The same weights with zero point -1 and every value one lower dequantize to exactly the same numbers (symmetric
int8 weights lie in [-127, 127], so ``q - 1`` fits in int8), and send the convolution to the GEMM.  Measured on
a 2-core Xeon with AMX (``benchmarks/int8_ceiling.py --convs``, one thread, ONNX Runtime 1.32): the GEMM is
1.2-2.0x faster where the reduction is deep (input channels x kernel area of 1024 and more: 3x3 convolutions
from 128 channels), or at least 256 deep on outputs of at most 32 x 32 pixels; shallow ones on large images
(1x1 from 64 channels at 56 x 56: 0.65x; 3x3 from 64 channels at 56 x 56: 0.92x) stay on the symmetric kernel.
The outputs are bit-identical either way.

OpenVINO runs int8 convolutions only with symmetric weights: the rewrite is for graphs shaped for ONNX Runtime
(``runtime: ort``), and only where the CPU the artifact is built for has AMX-INT8 (``$QDEPLOY_CPU_FLAGS`` names
another CPU).  Grouped and depthwise convolutions keep their own kernels.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

import numpy as np

from qdeploy.targets.int8_path import cpu_flags

if TYPE_CHECKING:
    import onnx

__all__ = ["ALWAYS_DEPTH", "MAX_PIXELS", "MIN_DEPTH", "amx_gemm_wanted", "gemm_pays", "host_facts",
           "route_convs_to_gemm"]

ALWAYS_DEPTH = 1024
"""A reduction at least this deep (input channels x kernel area) runs faster on the AMX GEMM at any image size."""
MIN_DEPTH = 256
MAX_PIXELS = 1024
"""From ``MIN_DEPTH``, the GEMM pays on outputs of at most this many pixels (im2col costs grow with the image)."""
_INT8 = 3  # TensorProto.INT8
_VALUE_TYPES = frozenset({1, 2, 3, 6, 10})
"""float, uint8, int8, int32, float16: weights, biases, scales and zero points (int64 may be a shape)."""


def amx_gemm_wanted(runtime: str | None, targets: Iterable[str]) -> bool:
    """Whether an int8 graph shaped for ``runtime`` should route its deep convolutions to ONNX Runtime's GEMM:
    a graph for ONNX Runtime, its CPU provider among ``targets`` (or none named) and not its OpenVINO provider
    (which compiles the graph with OpenVINO: float convolutions there), and AMX-INT8 on the CPU."""
    targets = list(targets)
    on_cpu = (not targets or "ort:cpu" in targets) and "ort:openvino" not in targets
    flags, _ = cpu_flags()
    return runtime == "ort" and on_cpu and "amx_int8" in flags


def host_facts(runtime: str | None) -> dict[str, bool]:
    """What of the build machine a graph for ``runtime`` depends on (it enters the artifact's cache key): AMX-INT8,
    for ONNX Runtime's graph, where the machine has it."""
    return {"amx_int8": True} if runtime == "ort" and "amx_int8" in cpu_flags()[0] else {}


def gemm_pays(depth: int, pixels: int | None) -> bool:
    """The measured rule (module docstring): deep reductions always, moderately deep ones on small outputs."""
    return depth >= ALWAYS_DEPTH or (depth >= MIN_DEPTH and pixels is not None and pixels <= MAX_PIXELS)


def route_convs_to_gemm(model: onnx.ModelProto,
                        pays: Callable[[int, int | None], bool] = gemm_pays) -> list[str]:
    """Give the symmetric int8 weights of each Conv for which ``pays(depth, pixels)`` zero point -1 (values one
    lower, the same dequantized numbers); the names of the Convs changed."""
    from onnx import numpy_helper

    graph = model.graph
    initializers = {init.name: init for init in graph.initializer}
    readers: dict[str, int] = {}
    for node in graph.node:
        for name in node.input:
            readers[name] = readers.get(name, 0) + 1
    producers = {out: node for node in graph.node for out in node.output}
    pixels = _output_pixels(model)
    routed = []
    for conv in (node for node in graph.node if node.op_type == "Conv" and _group(node) == 1):
        dq = producers.get(conv.input[1]) if len(conv.input) > 1 else None
        if dq is None or dq.op_type != "DequantizeLinear" or len(dq.input) < 3:
            continue
        weight, zero = initializers.get(dq.input[0]), initializers.get(dq.input[2])
        if weight is None or zero is None or weight.data_type != _INT8 or readers.get(weight.name) != 1 \
                or readers.get(zero.name) != 1 or len(weight.dims) < 3:
            continue
        depth = int(weight.dims[1]) * math.prod(int(dim) for dim in weight.dims[2:])
        if not pays(depth, pixels.get(conv.output[0])):
            continue
        values, zeros = numpy_helper.to_array(weight), numpy_helper.to_array(zero)
        if np.any(zeros != 0) or values.min() < -127:
            continue  # not symmetric int8: nothing to shift, or no room below
        weight.CopyFrom(numpy_helper.from_array((values.astype(np.int16) - 1).astype(np.int8), weight.name))
        zero.CopyFrom(numpy_helper.from_array(np.full(zeros.shape, -1, np.int8), zero.name))
        routed.append(conv.name)
    return routed


def _group(node: onnx.NodeProto) -> int:
    return next((int(attr.i) for attr in node.attribute if attr.name == "group"), 1)


def _output_pixels(model: onnx.ModelProto) -> dict[str, int]:
    """Conv output -> its pixels per image (spatial dims multiplied), where shape inference knows them all."""
    import onnx

    convs = {node.output[0] for node in model.graph.node if node.op_type == "Conv"}
    if not convs:
        return {}
    graph_only = onnx.ModelProto()
    graph_only.CopyFrom(model)
    for init in graph_only.graph.initializer:  # a shape needs the weights' dims, not their values
        if init.data_type in _VALUE_TYPES and init.raw_data:
            init.ClearField("raw_data")
            init.data_location = onnx.TensorProto.EXTERNAL
            del init.external_data[:]
            init.external_data.add(key="location", value="unread")
    try:
        inferred = onnx.shape_inference.infer_shapes(graph_only)
    except Exception:  # no shapes: the rule decides from the depth alone
        return {}
    found = {}
    for value in [*inferred.graph.value_info, *inferred.graph.output]:
        if value.name in convs:
            dims = [dim.dim_value for dim in value.type.tensor_type.shape.dim][2:]
            if dims and all(dims):
                found[value.name] = math.prod(dims)
    return found
