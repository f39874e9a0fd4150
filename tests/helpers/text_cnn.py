"""Synthetic graphs of the class whose OpenVINO int8 went wrong (issue 27): a tf2onnx Keras text CNN, a causal shift.

``text_cnn``: two float inputs of character ids ``[N, 21]`` -> Cast(int64) -> Gather from one embedding table;
per input, Conv1D(padding='causal') branches written as tf2onnx writes them (Pad on the time axis -> Unsqueeze ->
Transpose -> Conv -> Relu -> Transpose -> Squeeze), all branches merged by a chain of binary element-wise Max;
Dense layers as MatMul + Add; a Sigmoid head.  Seeded weights, opset 13.

``joined_text_cnn``: a Keras text CNN that joins tensors of very different ranges (the class of a real tf2onnx
word segmenter): embeddings after a BatchNormalization (|x| < 4), the element-wise Max of Conv1D branches each
followed by a per-step Dense that reaches hundreds, and a second embedding, concatenated on the channel axis; a
BatchNormalization evens the channels out, then Flatten, two Dense layers and a Sigmoid.

``causal_shift``: a sequence shifted by Slice + Pad and merged with itself by Max, then a MatMul.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper

from tests.helpers.quantize import init, make_model

LENGTH = 21
VOCAB = 60
EMBED = 16
FILTERS = 24
KERNELS = (2, 3, 4)


def text_cnn(batch: int | str = "N", *, kernels: tuple[int, ...] = KERNELS, seed: int = 0,
             logits: bool = False) -> onnx.ModelProto:
    """The text CNN; ``batch`` a number or a symbolic name; ``logits``: the Sigmoid's input is an output too."""
    rng = np.random.default_rng(seed)
    nodes: list[onnx.NodeProto] = []
    inits = [init("axes1", [1], np.int64), init("flat", [-1, LENGTH * FILTERS], np.int64),
             init("emb", rng.standard_normal((VOCAB, EMBED)) * 0.5)]
    branches: list[str] = []
    for side in ("a", "b"):
        nodes += [helper.make_node("Cast", [side], [f"{side}_ids"], name=f"{side}_cast", to=TensorProto.INT64),
                  helper.make_node("Gather", ["emb", f"{side}_ids"], [f"{side}_emb"], name=f"{side}_gather")]
        branches += [_conv1d_branch(nodes, inits, rng, f"{side}_emb", f"{side}_k{k}", k) for k in kernels]
    merged = branches[0]
    for index, branch in enumerate(branches[1:]):
        nodes.append(helper.make_node("Max", [merged, branch], [f"max{index}"], name=f"max_{index}"))
        merged = f"max{index}"
    nodes.append(helper.make_node("Reshape", [merged, "flat"], ["flat_out"], name="flatten"))
    hidden = _dense(nodes, inits, rng, "flat_out", "dense1", LENGTH * FILTERS, 32, relu=True)
    logits_name = _dense(nodes, inits, rng, hidden, "dense2", 32, 1, relu=False)
    nodes.append(helper.make_node("Sigmoid", [logits_name], ["y"], name="head"))
    outputs = ["y", logits_name] if logits else ["y"]
    graph = helper.make_graph(nodes, "text_cnn", [helper.make_tensor_value_info(name, TensorProto.FLOAT,
                                                                                 [batch, LENGTH]) for name in "ab"],
                              [helper.make_tensor_value_info(name, TensorProto.FLOAT, [batch, 1]) for name in outputs],
                              inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


def _conv1d_branch(nodes: list[onnx.NodeProto], inits: list[onnx.TensorProto], rng: np.random.Generator,
                   source: str, name: str, k: int) -> str:
    """Keras Conv1D(padding='causal'): the [N, L, C] input padded by k-1 in front, ExpandDims, NHWC -> NCHW."""
    inits += [init(f"{name}_pads", [0, k - 1, 0, 0, 0, 0], np.int64),
              init(f"{name}_w", rng.standard_normal((FILTERS, EMBED, 1, k)) * np.sqrt(2.0 / (EMBED * k))),
              init(f"{name}_b", rng.uniform(-0.1, 0.2, FILTERS))]
    steps = [("Pad", [f"{name}_pads"], {"mode": "constant"}), ("Unsqueeze", ["axes1"], {}),
             ("Transpose", [], {"perm": [0, 3, 1, 2]})]
    current = source
    for op, extra, attrs in steps:
        out = f"{name}_{op.lower()}"
        nodes.append(helper.make_node(op, [current, *extra], [out], name=out, **attrs))
        current = out
    nodes += [helper.make_node("Conv", [current, f"{name}_w", f"{name}_b"], [f"{name}_conv"],
                               name=f"{name}_conv", kernel_shape=[1, k]),
              helper.make_node("Relu", [f"{name}_conv"], [f"{name}_relu"], name=f"{name}_relu"),
              helper.make_node("Transpose", [f"{name}_relu"], [f"{name}_back"], name=f"{name}_to_nhwc",
                               perm=[0, 2, 3, 1]),
              helper.make_node("Squeeze", [f"{name}_back", "axes1"], [f"{name}_out"], name=f"{name}_squeeze")]
    return f"{name}_out"


def _dense(nodes: list[onnx.NodeProto], inits: list[onnx.TensorProto], rng: np.random.Generator, source: str,
           name: str, fan_in: int, fan_out: int, *, relu: bool) -> str:
    inits += [init(f"{name}_w", rng.standard_normal((fan_in, fan_out)) * np.sqrt(2.0 / fan_in)),
              init(f"{name}_b", rng.uniform(-0.1, 0.1, fan_out))]
    nodes += [helper.make_node("MatMul", [source, f"{name}_w"], [f"{name}_mm"], name=f"{name}_matmul"),
              helper.make_node("Add", [f"{name}_mm", f"{name}_b"], [f"{name}_add"], name=f"{name}_add")]
    if not relu:
        return f"{name}_add"
    nodes.append(helper.make_node("Relu", [f"{name}_add"], [f"{name}_relu"], name=f"{name}_relu"))
    return f"{name}_relu"


TYPES, TYPE_EMBED, STEP_DENSE = 12, 6, 5


def joined_text_cnn(batch: int = 4, seed: int = 0) -> onnx.ModelProto:
    """The joined text CNN (module docstring): inputs ``a`` (character ids < VOCAB) and ``b`` (type ids < TYPES)
    ``[batch, 21]``; outputs ``y`` (the Sigmoid) and ``logits``."""
    rng = np.random.default_rng(seed)
    nodes: list[onnx.NodeProto] = []
    inits = [init("emb", rng.standard_normal((VOCAB, EMBED))), init("types", rng.standard_normal((TYPES, TYPE_EMBED))),
             init("bn1_s", rng.uniform(0.7, 0.9, EMBED)), init("bn1_b", rng.uniform(-0.5, 0.5, EMBED)),
             init("axes1", [1], np.int64)]
    for side, table in (("a", "emb"), ("b", "types")):
        nodes += [helper.make_node("Cast", [side], [f"{side}_ids"], name=f"{side}_cast", to=TensorProto.INT64),
                  helper.make_node("Gather", [table, f"{side}_ids"], [f"{side}_emb"], name=f"{side}_gather")]
    nodes += [helper.make_node("Mul", ["a_emb", "bn1_s"], ["a_scaled"], name="bn1_mul"),
              helper.make_node("Add", ["a_scaled", "bn1_b"], ["a_bn"], name="bn1_add")]
    merged = ""
    for k in KERNELS:
        branch = _conv1d_branch(nodes, inits, rng, "a_bn", f"k{k}", k)
        inits += [init(f"k{k}_step_w", rng.standard_normal((FILTERS, STEP_DENSE)) * 30 * np.sqrt(2.0 / FILTERS)),
                  init(f"k{k}_step_b", rng.uniform(-5, 5, STEP_DENSE))]
        nodes += [helper.make_node("MatMul", [branch, f"k{k}_step_w"], [f"k{k}_step"], name=f"k{k}_step_matmul"),
                  helper.make_node("Add", [f"k{k}_step", f"k{k}_step_b"], [f"k{k}_dense"], name=f"k{k}_step_add")]
        if merged:
            nodes.append(helper.make_node("Max", [merged, f"k{k}_dense"], [f"max_k{k}"], name=f"max_k{k}"))
        merged = f"max_k{k}" if merged else f"k{k}_dense"
    channels = EMBED + STEP_DENSE + TYPE_EMBED
    spread = np.concatenate([np.ones(EMBED), np.full(STEP_DENSE, 0.01), np.ones(TYPE_EMBED)])
    inits += [init("bn2_s", spread * rng.uniform(0.8, 1.2, channels)), init("bn2_b", rng.uniform(-0.2, 0.2, channels)),
              init("flat", [-1, LENGTH * channels], np.int64)]
    nodes += [helper.make_node("Concat", ["a_bn", merged, "b_emb"], ["joined"], name="join", axis=-1),
              helper.make_node("Mul", ["joined", "bn2_s"], ["joined_scaled"], name="bn2_mul"),
              helper.make_node("Add", ["joined_scaled", "bn2_b"], ["joined_bn"], name="bn2_add"),
              helper.make_node("Reshape", ["joined_bn", "flat"], ["flat_out"], name="flatten")]
    hidden = _dense(nodes, inits, rng, "flat_out", "dense1", LENGTH * channels, 32, relu=True)
    logits = _dense(nodes, inits, rng, hidden, "dense2", 32, 1, relu=False)
    nodes += [helper.make_node("Sigmoid", [logits], ["y"], name="head"),
              helper.make_node("Identity", [logits], ["logits"], name="logits")]
    return make_model(nodes, inits, {"a": [batch, LENGTH], "b": [batch, LENGTH]},
                      {"y": [batch, 1], "logits": [batch, 1]}, opset=13)


def joined_feeds(count: int, batch: int = 4, seed: int = 1) -> list[dict[str, np.ndarray]]:
    """Character ids and type ids as floats, as the joined text CNN reads them."""
    rng = np.random.default_rng(seed)
    return [{"a": rng.integers(0, VOCAB, (batch, LENGTH)).astype(np.float32),
             "b": rng.integers(0, TYPES, (batch, LENGTH)).astype(np.float32)} for _ in range(count)]


def text_feeds(count: int, batch: int = 8, seed: int = 1) -> list[dict[str, np.ndarray]]:
    """Character ids as floats (0 pads the tail of short strings, as a tokenizer does)."""
    rng = np.random.default_rng(seed)
    feeds = []
    for _ in range(count):
        feed = {}
        for name in "ab":
            ids = rng.integers(1, VOCAB, (batch, LENGTH)).astype(np.float32)
            lengths = rng.integers(5, LENGTH + 1, batch)
            ids[np.arange(LENGTH)[None, :] >= lengths[:, None]] = 0
            feed[name] = ids
        feeds.append(feed)
    return feeds


SHIFT_LENGTH, SHIFT_CHANNELS, SHIFT = 8, 4, 2


def causal_shift() -> onnx.ModelProto:
    """x [1, 8, 4] -> Slice (first 6 steps) -> Pad (2 in front: x shifted by 2) -> Max with x -> MatMul -> y."""
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("Slice", ["x", "start", "end", "axis"], ["head"], name="slice"),
             helper.make_node("Pad", ["head", "pads"], ["shifted"], name="shift", mode="constant"),
             helper.make_node("Max", ["shifted", "x"], ["merged"], name="merge"),
             helper.make_node("MatMul", ["merged", "w"], ["y"], name="dense")]
    inits = [init("start", [0], np.int64), init("end", [SHIFT_LENGTH - SHIFT], np.int64), init("axis", [1], np.int64),
             init("pads", [0, SHIFT, 0, 0, 0, 0], np.int64), init("w", rng.standard_normal((SHIFT_CHANNELS, 5)))]
    return make_model(nodes, inits, {"x": [1, SHIFT_LENGTH, SHIFT_CHANNELS]}, {"y": [1, SHIFT_LENGTH, 5]}, opset=13)


def main(argv: list[str] | None = None) -> None:
    """``python -m tests.helpers.text_cnn model.onnx --data folder``: the model (batch 64, logits exposed) and
    .npz samples of character ids for a recipe: 24 in folder/calib, 12 others in folder/val."""
    import argparse
    from pathlib import Path

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("model", type=Path)
    parser.add_argument("--data", type=Path, required=True)
    args = parser.parse_args(argv)
    args.model.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(text_cnn(64, logits=True), str(args.model))
    samples = text_feeds(36, 64, seed=1)
    for name, chosen in (("calib", samples[:24]), ("val", samples[24:])):
        (args.data / name).mkdir(parents=True, exist_ok=True)
        for index, sample in enumerate(chosen):
            np.savez(args.data / name / f"s{index:03d}.npz", **sample)


if __name__ == "__main__":
    main()
