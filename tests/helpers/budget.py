"""Models whose quantization error is the sum of many layers, and samples a detector is confident on (budget tests)."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper

from tests.helpers.quantize import (
    init,
    make_model,
    run_ort,
)

TOKENS, WIDTH = 16, 64


def outlier_encoder(path: Path) -> Path:
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    layers = torch.nn.ModuleList([torch.nn.TransformerEncoderLayer(WIDTH, 2, 2 * WIDTH, dropout=0.0,
                                                                   batch_first=True, activation="gelu")
                                  for _ in range(4)])

    class Encoder(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layers = layers

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for layer in self.layers:
                x = layer(x)
            return x

    model = Encoder().eval()
    with torch.no_grad():
        for layer in model.layers:
            channels = torch.randperm(WIDTH)[:4]
            layer.norm1.weight[channels] *= 60.0
            layer.norm2.weight[channels] *= 60.0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (torch.randn(1, TOKENS, WIDTH),), str(path), input_names=["x"],
                          output_names=["y"], opset_version=17, dynamo=False)
    exported = onnx.load(str(path))
    exported.ir_version = 8
    onnx.save(exported, str(path))
    return path


def binarizing_detector(layers: int = 24, width: int = 32) -> onnx.ModelProto:
    """A DB-style text detector in miniature: a residual MLP (its error is the sum of its layers'), a score per
    row, and a binarization Sigmoid(1000 * score) whose outputs are exactly 0 or 1 away from the threshold,
    so one layer's error alone changes no output at all (as PP-OCR det's head on its data)."""
    rng = np.random.default_rng(0)
    nodes, inits, h = [], [], "x"
    for layer in range(layers):
        inits += [init(f"a{layer}", rng.standard_normal((width, width)) * np.sqrt(2 / width)),
                  init(f"b{layer}", rng.standard_normal((width, width)) * np.sqrt(0.5 / width))]
        nodes += [helper.make_node("MatMul", [h, f"a{layer}"], [f"u{layer}"], name=f"up{layer}"),
                  helper.make_node("Relu", [f"u{layer}"], [f"r{layer}"], name=f"relu{layer}"),
                  helper.make_node("MatMul", [f"r{layer}", f"b{layer}"], [f"d{layer}"], name=f"down{layer}"),
                  helper.make_node("Add", [h, f"d{layer}"], [f"h{layer}"], name=f"residual{layer}")]
        h = f"h{layer}"
    v = rng.standard_normal((width, 1)) / np.sqrt(width)
    raw = run_ort(make_model(nodes, inits, {"x": ["n", width]}, [h]),
                  {"x": rng.standard_normal((4000, width)).astype(np.float32)})[0]
    projected = raw @ v
    scale = 1.0 / projected.std()  # scores of unit spread, centred on the threshold
    inits += [init("v", v * scale), init("c", [-float(np.median(projected)) * scale]), init("k", 1000.0)]
    nodes += [helper.make_node("MatMul", [h, "v"], ["raw"], name="score"),
              helper.make_node("Add", ["raw", "c"], ["s"], name="center"),
              helper.make_node("Mul", ["s", "k"], ["ks"], name="gain"),
              helper.make_node("Sigmoid", ["ks"], ["y"], name="binarize")]
    return make_model(nodes, inits, {"x": ["n", width]}, ["y"])


def confident_samples(model: onnx.ModelProto, count: int, rows: int = 64, gap: float = 0.25) -> list[np.ndarray]:
    """Samples of rows whose float score is at least ``gap`` from the threshold (a detector's data is mostly
    confident): one layer's quantization error cannot flip them, the sum of 48 can."""
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    probe.graph.output.append(onnx.ValueInfoProto(name="s"))
    width = model.graph.input[0].type.tensor_type.shape.dim[1].dim_value
    x = np.random.default_rng(7).standard_normal((60000, width)).astype(np.float32)
    scores = run_ort(probe, {"x": x})[1][:, 0]
    confident = x[np.abs(scores) > gap]
    assert len(confident) >= count * rows
    return [confident[index * rows:(index + 1) * rows] for index in range(count)]
