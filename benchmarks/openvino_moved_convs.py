"""Does OpenVINO compute an int8 convolution right when its int8 input reaches it through data movement and a
Concat follows it?

    python benchmarks/openvino_moved_convs.py

Four-node QDQ graphs, each run by ONNX Runtime (exact integer arithmetic) and by OpenVINO's CPU plugin pinned to
f32 on the same input (a sine of amplitude 0.6 quantized with scale 0.004: most of the 8-bit grid); the table
prints the cosine between the two outputs.  Every graph is: input -> QuantizeLinear -> DequantizeLinear ->
(a mover) -> Conv with int8 per-channel weights -> (something) -> Concat of that with itself.  ``int8`` quantizes
the input with zero point 0, ``uint8`` with zero point 128 (the same values, exactly).  The controls: no mover
(the dequantization read straight by the Conv), no Concat after it, and a MatMul or a depthwise convolution
reading instead of the Conv.  qdeploy moves such pairs to uint8 where
OpenVINO runs the graph because of what this printed on an AVX512-VNNI CPU without AMX
(``stages/quantize/ptq/_concat_uint8.py``, ``uint8_before_moved_convs``; basic-pitch's constant-Q transform).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.int8 import machine_line  # noqa: E402
from benchmarks.openvino_concat import cosine  # noqa: E402

WIDTH, SCALE = 939, 0.004
MOVERS = ("none", "Reshape", "Unsqueeze", "Transpose", "MaxPool")
AFTER = ("Concat", "Relu, Concat", "float Conv, Concat", "no Concat")


def _mover(kind: str, nodes: list, inits: list) -> tuple[str, list[int]]:
    """The mover between the dequantization and the convolution: its output and the graph input's shape."""
    if kind == "Reshape":
        inits.append(numpy_helper.from_array(np.array([1, 1, 1, WIDTH], np.int64), "shape"))
        nodes.append(helper.make_node("Reshape", ["d", "shape"], ["m"]))
        return "m", [1, 1, WIDTH]
    if kind == "Unsqueeze":
        inits.append(numpy_helper.from_array(np.array([2], np.int64), "axes"))
        nodes.append(helper.make_node("Unsqueeze", ["d", "axes"], ["m"]))
        return "m", [1, 1, WIDTH]
    if kind == "Transpose":
        nodes.append(helper.make_node("Transpose", ["d"], ["m"], perm=[0, 1, 3, 2]))
        return "m", [1, 1, WIDTH, 1]
    if kind == "MaxPool":
        nodes.append(helper.make_node("MaxPool", ["d"], ["m"], kernel_shape=[1, 2]))
        return "m", [1, 1, 1, WIDTH]
    return "d", [1, 1, 1, WIDTH]


def graph(mover: str, after: str, dtype: type, rng: np.random.Generator) -> tuple[onnx.ModelProto, list[int]]:
    zero = 0 if dtype == np.int8 else 128
    weights = rng.normal(0, 0.1, (4, 1, 1, 16)).astype(np.float32)
    scales = (np.abs(weights).reshape(4, -1).max(1) / 127).astype(np.float32)
    inits = [numpy_helper.from_array(np.array(SCALE, np.float32), "s"),
             numpy_helper.from_array(np.array(zero, dtype), "z"),
             numpy_helper.from_array(np.round(weights / scales[:, None, None, None]).astype(np.int8), "wq"),
             numpy_helper.from_array(scales, "ws"), numpy_helper.from_array(np.zeros(4, np.int8), "wz")]
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"]),
             helper.make_node("DequantizeLinear", ["q", "s", "z"], ["d"]),
             helper.make_node("DequantizeLinear", ["wq", "ws", "wz"], ["w"], axis=0)]
    source, shape = _mover(mover, nodes, inits)
    nodes.append(helper.make_node("Conv", [source, "w"], ["y"], kernel_shape=[1, 16]))
    last = "y"
    if after.startswith("Relu"):
        nodes.append(helper.make_node("Relu", ["y"], ["r"]))
        last = "r"
    elif after.startswith("float Conv"):
        inits.append(numpy_helper.from_array(rng.normal(0, 0.3, (4, 4, 1, 1)).astype(np.float32), "w2"))
        nodes.append(helper.make_node("Conv", ["y", "w2"], ["r"], kernel_shape=[1, 1]))
        last = "r"
    if after != "no Concat":
        nodes.append(helper.make_node("Concat", [last, last], ["out"], axis=1))
        last = "out"
    model = helper.make_model(helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                                           shape)],
                                                [helper.make_tensor_value_info(last, TensorProto.FLOAT, None)], inits),
                              opset_imports=[helper.make_opsetid("", 17)])
    return model, shape


def other_reader(reader: str, dtype: type, rng: np.random.Generator) -> tuple[onnx.ModelProto, list[int]]:
    """The same pattern (pair -> Reshape -> reader -> Concat) with a MatMul or a depthwise convolution reading."""
    zero = 0 if dtype == np.int8 else 128
    matmul = reader == "MatMul"
    weights = rng.normal(0, 0.1, (64, 32) if matmul else (8, 1, 1, 5)).astype(np.float32)
    scales = (np.abs(weights).max(0) if matmul else np.abs(weights).reshape(8, -1).max(1)) / 127
    levels = np.round(weights / (scales if matmul else scales[:, None, None, None])).astype(np.int8)
    shape, target = ([4, 64], [1, 4, 64]) if matmul else ([1, 8, 256], [1, 8, 1, 256])
    inits = [numpy_helper.from_array(np.array(SCALE, np.float32), "s"),
             numpy_helper.from_array(np.array(zero, dtype), "z"), numpy_helper.from_array(levels, "wq"),
             numpy_helper.from_array(scales.astype(np.float32), "ws"),
             numpy_helper.from_array(np.zeros(scales.size, np.int8), "wz"),
             numpy_helper.from_array(np.array(target, np.int64), "shape")]
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"]),
             helper.make_node("DequantizeLinear", ["q", "s", "z"], ["d"]),
             helper.make_node("DequantizeLinear", ["wq", "ws", "wz"], ["w"], axis=1 if matmul else 0),
             helper.make_node("Reshape", ["d", "shape"], ["m"]),
             helper.make_node("MatMul", ["m", "w"], ["y"]) if matmul else
             helper.make_node("Conv", ["m", "w"], ["y"], kernel_shape=[1, 5], group=8),
             helper.make_node("Concat", ["y", "y"], ["out"], axis=-1 if matmul else 1)]
    model = helper.make_model(helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                                           shape)],
                                                [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)], inits),
                              opset_imports=[helper.make_opsetid("", 17)])
    return model, shape


def agreement(mover: str, after: str, dtype: type, seed: int = 0) -> float:
    import onnxruntime as ort
    import openvino as ov

    rng = np.random.default_rng(seed)
    model, shape = other_reader(mover, dtype, rng) if after == "other reader" else graph(mover, after, dtype, rng)
    feed = {"x": (0.6 * np.sin(np.arange(int(np.prod(shape))) / 7.0)).astype(np.float32).reshape(shape)}
    data = model.SerializeToString()
    expected = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, feed)[0]
    core = ov.Core()
    compiled = core.compile_model(core.read_model(data, b""), "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    produced = np.asarray(compiled(feed)[compiled.output(0)])
    return cosine(expected, produced)


def main() -> None:
    print(machine_line())
    print("| between the dequantization and the Conv | after the Conv | int8 (zero point 0) | uint8 (zero point 128) |")
    print("|---|---|---|---|")
    for mover in MOVERS:
        for after in AFTER if mover in ("none", "Reshape") else AFTER[:1]:
            row = [agreement(mover, after, dtype) for dtype in (np.int8, np.uint8)]
            print(f"| {mover} | {after} | {row[0]:.4f} | {row[1]:.4f} |")
    for reader in ("MatMul", "depthwise Conv"):
        row = [agreement(reader, "other reader", dtype) for dtype in (np.int8, np.uint8)]
        print(f"| Reshape, then a {reader} instead | Concat | {row[0]:.4f} | {row[1]:.4f} |")


if __name__ == "__main__":
    main()
