"""Does OpenVINO compute a convolution that reads a Concat of int8 tensors right on this CPU?

    python benchmarks/openvino_concat.py [--seed 0]

Small QDQ graphs, each run by ONNX Runtime (exact integer arithmetic) and by OpenVINO's CPU plugin pinned to f32 on
the same input; the table prints the cosine between the two outputs.  Every graph quantizes its inputs
(QuantizeLinear -> DequantizeLinear, scale 17.67, values with a standard deviation of 700: most of the 8-bit grid)
and ends in a convolution with int8 per-channel weights.  Between them: nothing, a MaxPool, a Resize, a Concat of
two quantized inputs (with or without a QuantizeLinear of its own on the Concat's output), a Split and Concat, a
Concat of a quantized and a float tensor.  ``int8`` quantizes with zero point 0, ``uint8`` with zero point 128;
the std column scales the inputs down (how the error grows with the values).  The last table concatenates uint8
inputs whose scales or zero points differ, with 16 or 4 channels each.  qdeploy keeps what a Concat reads or
writes uint8 because of what this prints on AVX512-VNNI CPUs without AMX (``stages/quantize/ptq/_ptq.py``,
``concatenated``; ``_concat_uint8`` for graphs NNCF quantized).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.int8 import machine_line  # noqa: E402

CHANNELS, SIDE, SCALE = 16, 20, 17.67


PARAMETERS: dict[str, tuple[float, int]] = {}
"""Per input name, a (scale, zero point) other than the default (the last table)."""


def _quantized_input(name: str, dtype: type, nodes: list, inits: list) -> str:
    scale, zero_point = PARAMETERS.get(name, (SCALE, 0 if dtype == np.int8 else 128))
    inits += [numpy_helper.from_array(np.array(scale, np.float32), f"{name}_s"),
              numpy_helper.from_array(np.array(zero_point, dtype), f"{name}_z")]
    nodes += [helper.make_node("QuantizeLinear", [name, f"{name}_s", f"{name}_z"], [f"{name}_q"]),
              helper.make_node("DequantizeLinear", [f"{name}_q", f"{name}_s", f"{name}_z"], [f"{name}_d"])]
    return f"{name}_d"


def _between(kind: str, dtype: type, nodes: list, inits: list) -> tuple[str, int, list[str]]:
    """The nodes between the quantized inputs and the convolution: (its input, how many inputs' channels it holds,
    the float inputs)."""
    first = _quantized_input("x0", dtype, nodes, inits)
    if kind == "none":
        return first, 1, ["x0"]
    if kind == "MaxPool":
        nodes.append(helper.make_node("MaxPool", [first], ["m"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]))
        return "m", 1, ["x0"]
    if kind == "Resize":
        inits.append(numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales"))
        nodes.append(helper.make_node("Resize", [first, "", "scales"], ["m"], mode="nearest"))
        return "m", 1, ["x0"]
    if kind == "Split+Concat":
        nodes += [helper.make_node("Split", [first], ["a", "b"], axis=1),
                  helper.make_node("Concat", ["b", "a"], ["m"], axis=1)]
        return "m", 1, ["x0"]
    if kind == "Concat, float beside":
        nodes.append(helper.make_node("Concat", [first, "x1"], ["m"], axis=1))
        return "m", 2, ["x0", "x1"]
    second = _quantized_input("x1", dtype, nodes, inits)
    nodes.append(helper.make_node("Concat", [first, second], ["m"], axis=1))
    if kind == "Concat, int8 Q after":
        inits += [numpy_helper.from_array(np.array(2 * SCALE, np.float32), "m_s"),
                  numpy_helper.from_array(np.array(0, np.int8), "m_z")]
        nodes += [helper.make_node("QuantizeLinear", ["m", "m_s", "m_z"], ["m_q"]),
                  helper.make_node("DequantizeLinear", ["m_q", "m_s", "m_z"], ["m_d"])]
        return "m_d", 2, ["x0", "x1"]
    return "m", 2, ["x0", "x1"]


def graph(kind: str, dtype: type, rng: np.random.Generator,
          channels: int = CHANNELS) -> tuple[onnx.ModelProto, list[str]]:
    nodes: list = []
    inits: list = []
    source, width, inputs = _between(kind, dtype, nodes, inits)
    weights = rng.normal(0, 0.3, (24, width * channels, 3, 3)).astype(np.float32)
    scales = (np.abs(weights).reshape(24, -1).max(1) / 127).astype(np.float32)
    inits += [numpy_helper.from_array(np.round(weights / scales[:, None, None, None]).astype(np.int8), "wq"),
              numpy_helper.from_array(scales, "ws"), numpy_helper.from_array(np.zeros(24, np.int8), "wz")]
    nodes += [helper.make_node("DequantizeLinear", ["wq", "ws", "wz"], ["w"], axis=0),
              helper.make_node("Conv", [source, "w"], ["y"], pads=[1, 1, 1, 1])]
    declared = [helper.make_tensor_value_info(name, TensorProto.FLOAT, [1, channels, SIDE, SIDE]) for name in inputs]
    output = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    model = helper.make_model(helper.make_graph(nodes, kind, declared, [output], inits),
                              opset_imports=[helper.make_opsetid("", 13)])
    return model, inputs


def cosine(expected: np.ndarray, produced: np.ndarray) -> float:
    expected, produced = expected.ravel().astype(np.float64), produced.ravel().astype(np.float64)
    return float(expected @ produced / (np.linalg.norm(expected) * np.linalg.norm(produced) + 1e-30))


def agreement(kind: str, dtype: type, std: float, seed: int, folder: Path, channels: int = CHANNELS) -> float:
    import onnxruntime as ort
    import openvino as ov

    rng = np.random.default_rng(seed)
    model, inputs = graph(kind, dtype, rng, channels)
    path = folder / "graph.onnx"
    onnx.save(model, str(path))
    feed = {name: rng.normal(0, std, (1, channels, SIDE, SIDE)).astype(np.float32) for name in inputs}
    if dtype == np.uint8:  # zero point 128: the same signed values fit
        feed = {name: np.clip(value, -128 * SCALE, 127 * SCALE) for name, value in feed.items()}
    expected = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feed)[0]
    compiled = ov.Core().compile_model(str(path), "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    produced = np.asarray(compiled.create_infer_request().infer(feed)[compiled.output(0)])
    return cosine(expected, produced)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    kinds = ["none", "MaxPool", "Resize", "Concat", "Concat, int8 Q after", "Split+Concat", "Concat, float beside"]
    print(machine_line())
    print("| between the quantized inputs and the convolution | int8 (zero point 0) | uint8 (zero point 128) |")
    print("|---|---|---|")
    with tempfile.TemporaryDirectory() as folder:
        for kind in kinds:
            row = [agreement(kind, dtype, 700.0, args.seed, Path(folder)) for dtype in (np.int8, np.uint8)]
            print(f"| {kind} | {row[0]:.4f} | {row[1]:.4f} |")
        print("\n| std of the inputs (Concat, int8) | largest step used | cosine |\n|---|---|---|")
        for std in (50.0, 200.0, 400.0, 700.0):
            print(f"| {std:.0f} | about {min(127, round(3.5 * std / SCALE))} | "
                  f"{agreement('Concat', np.int8, std, args.seed, Path(folder)):.4f} |")
        print("\n| Concat of two uint8 inputs: second input's (scale, zero point), first's (17.67, 128) "
              "| 16 channels each | 4 channels each |\n|---|---|---|")
        for second in ((SCALE, 128), (SCALE, 108), (1.5 * SCALE, 128), (1.5 * SCALE, 108)):
            PARAMETERS["x1"] = second
            row = [agreement("Concat", np.uint8, 200.0, args.seed, Path(folder), channels) for channels in (16, 4)]
            print(f"| {second[0]:.2f}, {second[1]} | {row[0]:.4f} | {row[1]:.4f} |")
        PARAMETERS.clear()


if __name__ == "__main__":
    main()
