"""Synthetic models of any node count for ``benchmarks/scaling.py`` and
``tests/stages/quantize/ptq/test_scaling_shapes.py``.

- ``chain``: one long chain, MatMul (16x16, norm-preserving) then Tanh, repeated:
  the 20,000-node chain of issue 14.
- ``conv``: a stack of MobileNet-style blocks on [1, 8, 8, 8]: Conv 3x3 -> Clip(0, 6)
  -> Conv 1x1 -> Add (residual) -> Clip(0, 6); 5 nodes a block.
- ``transformer``: encoder-like blocks on [1, 8, 16]: Q/K/V MatMuls, Transpose,
  MatMul, Mul (scale), Softmax, MatMul, output MatMul, Add, LayerNormalization,
  MatMul, Relu, MatMul, Add, LayerNormalization; 16 nodes a block.

Values stay bounded whatever the depth (Tanh, Clip, LayerNormalization), so every
stage runs on finite data at every size.  The node count is the requested one, to
within one block.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17


def _model(nodes: list[onnx.NodeProto], inits: list[onnx.TensorProto], shape: list[int], output: str,
           name: str) -> onnx.ModelProto:
    """Input x and the output have the same shape in every generated model."""
    graph = helper.make_graph(nodes, name, [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info(output, TensorProto.FLOAT, shape)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=8)


def _tensor(name: str, values: np.ndarray) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(values, dtype=np.float32), name)


def chain(nodes: int, seed: int = 0) -> onnx.ModelProto:
    """MatMul -> Tanh, repeated to ``nodes`` nodes; input x [1, 16]."""
    rng = np.random.default_rng(seed)
    graph_nodes, inits, current = [], [], "x"
    for block in range(max(1, nodes // 2)):
        orthogonal, _ = np.linalg.qr(rng.standard_normal((16, 16)))
        inits.append(_tensor(f"w{block}", 1.5 * orthogonal))
        graph_nodes += [helper.make_node("MatMul", [current, f"w{block}"], [f"m{block}"], name=f"matmul{block}"),
                        helper.make_node("Tanh", [f"m{block}"], [f"t{block}"], name=f"tanh{block}")]
        current = f"t{block}"
    return _model(graph_nodes, inits, [1, 16], current, "chain")


def conv(nodes: int, seed: int = 0) -> onnx.ModelProto:
    """Residual blocks Conv 3x3 -> Clip -> Conv 1x1 -> Add -> Clip; input x [1, 8, 8, 8]."""
    rng = np.random.default_rng(seed)
    inits = [_tensor("zero", 0.0), _tensor("six", 6.0)]
    graph_nodes, current = [], "x"
    for block in range(max(1, nodes // 5)):
        inits += [_tensor(f"k{block}", rng.standard_normal((8, 8, 3, 3)) * np.sqrt(2 / 72)),
                  _tensor(f"kb{block}", rng.uniform(-0.1, 0.1, 8)),
                  _tensor(f"p{block}", rng.standard_normal((8, 8, 1, 1)) * np.sqrt(1 / 8) * 0.5)]
        b = f"b{block}_"
        graph_nodes += [
            helper.make_node("Conv", [current, f"k{block}", f"kb{block}"], [b + "c"], name=b + "conv3",
                             pads=[1, 1, 1, 1]),
            helper.make_node("Clip", [b + "c", "zero", "six"], [b + "r"], name=b + "relu6"),
            helper.make_node("Conv", [b + "r", f"p{block}"], [b + "p"], name=b + "conv1"),
            helper.make_node("Add", [current, b + "p"], [b + "s"], name=b + "residual"),
            helper.make_node("Clip", [b + "s", "zero", "six"], [b + "o"], name=b + "out")]
        current = b + "o"
    return _model(graph_nodes, inits, [1, 8, 8, 8], current, "conv")


def transformer(nodes: int, seed: int = 0, tokens: int = 8, width: int = 16) -> onnx.ModelProto:
    """Encoder-like blocks (attention and MLP, post-norm), 16 nodes each; input x [1, tokens, width]."""
    rng = np.random.default_rng(seed)
    inits = [_tensor("scale", 1 / np.sqrt(width)), _tensor("gamma", np.ones(width)), _tensor("beta", np.zeros(width))]
    graph_nodes, current = [], "x"

    def weight(name: str, rows: int, cols: int) -> str:
        inits.append(_tensor(name, rng.standard_normal((rows, cols)) / np.sqrt(rows)))
        return name

    for block in range(max(1, nodes // 16)):
        b = f"l{block}_"

        def node(op: str, inputs: list[str], output: str, prefix: str = b, **attrs: object) -> None:
            graph_nodes.append(helper.make_node(op, inputs, [prefix + output], name=prefix + output, **attrs))

        node("MatMul", [current, weight(b + "wq", width, width)], "q")
        node("MatMul", [current, weight(b + "wk", width, width)], "k")
        node("MatMul", [current, weight(b + "wv", width, width)], "v")
        node("Transpose", [b + "k"], "kt", perm=[0, 2, 1])
        node("MatMul", [b + "q", b + "kt"], "scores")
        node("Mul", [b + "scores", "scale"], "scaled")
        node("Softmax", [b + "scaled"], "probs", axis=-1)
        node("MatMul", [b + "probs", b + "v"], "context")
        node("MatMul", [b + "context", weight(b + "wo", width, width)], "attn")
        node("Add", [current, b + "attn"], "res1")
        node("LayerNormalization", [b + "res1", "gamma", "beta"], "norm1", axis=-1)
        node("MatMul", [b + "norm1", weight(b + "w1", width, 2 * width)], "up")
        node("Relu", [b + "up"], "act")
        node("MatMul", [b + "act", weight(b + "w2", 2 * width, width)], "down")
        node("Add", [b + "norm1", b + "down"], "res2")
        node("LayerNormalization", [b + "res2", "gamma", "beta"], "out", axis=-1)
        current = b + "out"
    return _model(graph_nodes, inits, [1, tokens, width], current, "transformer")


SHAPES: dict[str, Callable[[int], onnx.ModelProto]] = {"chain": chain, "conv": conv, "transformer": transformer}
