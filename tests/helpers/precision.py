"""A model whose float16 artifact misses its tolerance in bfloat16 and holds in float32, and the CPU facts the
execution-precision tests pin with $QDEPLOY_CPU_FLAGS."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from qdeploy.targets.cpu_facts import openvino_precisions

BF16_CPU = "sse4_2 avx2 fma avx512f avx512bw avx512_vnni avx512_bf16"
AVX2_CPU = "sse4_2 avx2 fma"


def offset_model(offset: float = 100.0, width: int = 16) -> onnx.ModelProto:
    """y = (x + 100) @ W - (0x + 100) @ W: exact in float32; bfloat16 rounds x + 100 to steps of 0.5 before the
    MatMul, so y keeps about 12 dB SNR (cosine 0.97) there, while float16 weights alone keep 70 dB."""
    rng = np.random.default_rng(0)
    weight = (rng.standard_normal((width, width)) / np.sqrt(width)).astype(np.float32)
    nodes = [helper.make_node("Add", ["x", "c"], ["shifted"], name="shift"),
             helper.make_node("Mul", ["x", "zero"], ["z"], name="zeros"),
             helper.make_node("Add", ["z", "c"], ["base"], name="base"),
             helper.make_node("MatMul", ["shifted", "w"], ["a"], name="mm_shifted"),
             helper.make_node("MatMul", ["base", "w"], ["b"], name="mm_base"),
             helper.make_node("Sub", ["a", "b"], ["y"], name="unshift")]
    graph = helper.make_graph(
        nodes, "offset", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", width])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", width])],
        [numpy_helper.from_array(np.array(offset, np.float32), "c"),
         numpy_helper.from_array(np.array(0.0, np.float32), "zero"), numpy_helper.from_array(weight, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def openvino_runs_bf16_here() -> bool:
    """Whether this machine's OpenVINO can run bfloat16 at all (it ignores a bf16 hint on an AVX2 CPU), whatever
    $QDEPLOY_CPU_FLAGS describes."""
    try:
        return openvino_precisions("CPU").has_bf16
    except Exception:
        return False
