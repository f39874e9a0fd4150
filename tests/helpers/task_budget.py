"""Models and labelled data for the accuracy budget on a task metric.

- ``digits_classifier``: scikit-learn's MLP trained on its 8x8 digits, written as ONNX Gemm/Relu, with one
  hidden unit scaled 300x (and its outgoing weights 1/300x): the float function is unchanged, but the hidden
  layer's per-tensor int8 range now spans the outlier and flattens every other unit, as the outlier channels of
  trained networks do.  Plain int8 loses ~20 points of accuracy.
- ``branches``: parallel Gemm branches summed; each branch's weights hold an outlier in the column of an input
  that is always zero (no effect in float), which coarsens that branch's int8 step: the first branch adds the
  most error, the others less each.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from tests.helpers.quantize import run_ort

ACCURACY = ("import numpy as np\n\n\ndef accuracy(outputs, labels):\n"
            "    return float((np.asarray(outputs['logits']).argmax(-1) == np.asarray(labels).reshape(-1)).mean())\n")
NEG_MSE = ("import numpy as np\n\n\ndef neg_mse(outputs, labels):\n"
           "    return -float(np.mean((np.asarray(outputs['y']) - np.asarray(labels)) ** 2))\n")
FILES, ROWS = 16, 16


def digits_classifier(folder: Path) -> tuple[Path, Path, np.ndarray, np.ndarray]:
    """(model, a folder of 16 .npz budget samples of 16 rows each with labels, held-out inputs, their labels)."""
    from sklearn.datasets import load_digits
    from sklearn.neural_network import MLPClassifier

    inputs, labels = load_digits(return_X_y=True)
    inputs = (inputs / 16.0).astype(np.float32)
    order = np.random.default_rng(0).permutation(len(inputs))
    inputs, labels = inputs[order], labels[order]
    trained = MLPClassifier(hidden_layer_sizes=(64, 32), max_iter=300, random_state=0).fit(inputs[:1000],
                                                                                          labels[:1000])
    weights = [w.astype(np.float32).copy() for w in trained.coefs_]
    biases = [b.astype(np.float32).copy() for b in trained.intercepts_]
    weights[0][:, 0] *= 300.0  # the outlier unit: same function, a 300x wider int8 range
    biases[0][0] *= 300.0
    weights[1][0, :] /= 300.0
    path = folder / "digits.onnx"
    onnx.save(_mlp(weights, biases), path)
    data = folder / "budget"
    data.mkdir()
    start = 1000
    for index in range(FILES):
        rows = slice(start + ROWS * index, start + ROWS * (index + 1))
        np.savez(data / f"{index:02d}.npz", x=inputs[rows], label=labels[rows])
    (folder / "metrics.py").write_text(ACCURACY)
    held_out = start + ROWS * FILES
    return path, data, inputs[held_out:], labels[held_out:]


def _mlp(weights: list[np.ndarray], biases: list[np.ndarray]) -> onnx.ModelProto:
    nodes, inits, current = [], [], "x"
    for index, (weight, bias) in enumerate(zip(weights, biases, strict=True)):
        last = index == len(weights) - 1
        inits += [numpy_helper.from_array(weight.T.copy(), f"w{index}"), numpy_helper.from_array(bias, f"b{index}")]
        out = "logits" if last else f"pre{index}"
        nodes.append(helper.make_node("Gemm", [current, f"w{index}", f"b{index}"], [out], name=f"fc{index}",
                                      transB=1))
        if not last:
            current = f"h{index}"
            nodes.append(helper.make_node("Relu", [out], [current], name=f"relu{index}"))
    graph = helper.make_graph(nodes, "digits", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 64])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["n", 10])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def branches(folder: Path, outliers: tuple[float, ...] = (6.0, 2.5, 2.5, 2.5, 2.5)) -> tuple[Path, Path, np.ndarray,
                                                                                                np.ndarray]:
    """(model, 16 .npz budget samples labelled with the float outputs, 8 more such samples' inputs and outputs)."""
    rng = np.random.default_rng(0)
    nodes, inits = [], []
    for index, outlier in enumerate(outliers):
        weight = rng.standard_normal((32, 64)).astype(np.float32) * 0.1
        weight[:, 0] = outlier  # input column 0 is always zero: no effect in float, a coarse int8 step
        inits.append(numpy_helper.from_array(weight, f"w{index}"))
        nodes.append(helper.make_node("Gemm", ["x", f"w{index}"], [f"y{index}"], name=f"branch{index}", transB=1))
    nodes.append(helper.make_node("Sum", [f"y{index}" for index in range(len(outliers))], ["y"], name="sum"))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 32])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    path = folder / "branches.onnx"
    onnx.save(model, path)
    data = folder / "budget"
    data.mkdir()
    rows = []
    for index in range(FILES + 8):
        x = rng.uniform(0, 1, (32, 64)).astype(np.float32)
        x[:, 0] = 0
        if index < FILES:
            np.savez(data / f"{index:02d}.npz", x=x, label=run_ort(model, {"x": x})[0])
        else:
            rows.append(x)
    unseen = np.concatenate(rows)
    (folder / "metrics.py").write_text(NEG_MSE)
    return path, data, unseen, run_ort(model, {"x": unseen})[0]
