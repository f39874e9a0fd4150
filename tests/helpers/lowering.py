"""Fake-quantization graphs and checks of the lowering tests."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper

OV_DOMAIN = "org.openvinotoolkit"


SHAPE = [1, 4, 5, 5]


def ov_fake_quantize(x: np.ndarray, il: np.ndarray, ih: np.ndarray, ol: np.ndarray, oh: np.ndarray,
                     levels: int) -> np.ndarray:
    """OpenVINO's FakeQuantize specification, written out independently of qdeploy."""
    q = np.round((x - il) / (ih - il) * (levels - 1))
    out = q / (levels - 1) * (oh - ol) + ol
    return np.where(x <= np.minimum(il, ih), ol, np.where(x > np.maximum(il, ih), oh, out))


def covering_inputs(low: float, high: float, count: int = 4) -> list[np.ndarray]:
    """Inputs spread over the range and half its width beyond each end (clamping included)."""
    rng = np.random.default_rng(7)
    width = high - low
    return [rng.uniform(low - width / 2, high + width / 2, SHAPE).astype(np.float32) for _ in range(count)]


def assert_within(result: np.ndarray, expected: np.ndarray, allowed: float) -> None:
    error = float(np.max(np.abs(result.astype(np.float64) - expected)))
    assert error <= allowed * (1 + 1e-5) + 1e-6, f"error {error} above {allowed}"


def decomposed_nodes(x: str, y: str, *, scale: str, divide: bool, clip: tuple[str, str], zero: str | None = None,
                     zero_after_round: bool = False) -> list[onnx.NodeProto]:
    nodes = [helper.make_node("Div" if divide else "Mul", [x, scale if divide else f"{scale}_inv"], [f"{y}_s"])]
    rounded_input = f"{y}_s"
    if zero and not zero_after_round:
        nodes.append(helper.make_node("Add", [f"{y}_s", zero], [f"{y}_z"]))
        rounded_input = f"{y}_z"
    nodes.append(helper.make_node("Round", [rounded_input], [f"{y}_r"], name=f"{y}_round"))
    clip_input = f"{y}_r"
    if zero and zero_after_round:
        nodes.append(helper.make_node("Add", [f"{y}_r", zero], [f"{y}_rz"]))
        clip_input = f"{y}_rz"
    nodes.append(helper.make_node("Clip", [clip_input, *clip], [f"{y}_c"]))
    last = f"{y}_c"
    if zero:
        nodes.append(helper.make_node("Sub", [f"{y}_c", zero], [f"{y}_u"]))
        last = f"{y}_u"
    nodes.append(helper.make_node("Mul", [last, scale], [y]))
    return nodes
