"""Where the repository is, the demo recipe, a tiny CNN and recipe files written for a test."""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

REPO = Path(__file__).resolve().parents[2]


DEMO_RECIPE = REPO / "recipes" / "demo.yaml"


def tiny_cnn(seed: int = 0, channels: int = 8, size: int = 16, opset: int = 17) -> onnx.ModelProto:
    """Conv -> BatchNormalization -> Relu -> GlobalAveragePool -> Flatten -> Gemm: input [1,3,S,S], logits [1,10]."""
    rng = np.random.default_rng(seed)
    inits = [
        numpy_helper.from_array((rng.standard_normal((channels, 3, 3, 3)) * 0.3).astype(np.float32), "conv_w"),
        numpy_helper.from_array(rng.standard_normal(channels).astype(np.float32) * 0.1, "conv_b"),
        numpy_helper.from_array(rng.uniform(0.5, 1.5, channels).astype(np.float32), "bn_scale"),
        numpy_helper.from_array(rng.standard_normal(channels).astype(np.float32) * 0.1, "bn_bias"),
        numpy_helper.from_array(rng.standard_normal(channels).astype(np.float32) * 0.1, "bn_mean"),
        numpy_helper.from_array(rng.uniform(0.5, 1.5, channels).astype(np.float32), "bn_var"),
        numpy_helper.from_array((rng.standard_normal((10, channels)) * 0.3).astype(np.float32), "fc_w"),
        numpy_helper.from_array(rng.standard_normal(10).astype(np.float32) * 0.1, "fc_b"),
    ]
    nodes = [
        helper.make_node("Conv", ["input", "conv_w", "conv_b"], ["conv"], name="conv", pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["conv", "bn_scale", "bn_bias", "bn_mean", "bn_var"], ["bn"],
                         name="bn"),
        helper.make_node("Relu", ["bn"], ["relu"], name="relu"),
        helper.make_node("GlobalAveragePool", ["relu"], ["pool"], name="pool"),
        helper.make_node("Flatten", ["pool"], ["flat"], name="flatten"),
        helper.make_node("Gemm", ["flat", "fc_w", "fc_b"], ["logits"], name="fc", transB=1),
    ]
    graph = helper.make_graph(
        nodes, "tiny_cnn",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 3, size, size])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 10])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def write_recipe(folder: Path, body: str, name: str = "recipe.yaml") -> Path:
    path = folder / name
    path.write_text(textwrap.dedent(body).lstrip())
    return path


# a small torch Conv-BN-ReLU-Linear network; its file defines `build` (the torch export tests' factory)
TORCH_NET = '''
import torch


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(8)
        self.head = torch.nn.Linear(8, 4)

    def forward(self, x):
        y = torch.relu(self.bn(self.conv(x)))
        return self.head(y.mean(dim=(2, 3)))


def build():
    torch.manual_seed(0)
    return Net()
'''
