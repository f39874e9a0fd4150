"""A Concat of tensors with very different ranges stays float; movement feeding int8 is quantized before it, and
movement that reaches int8 compute only through a float op is not quantized where OpenVINO runs the graph.

The class: a tf2onnx Keras word segmenter (embeddings |x| < 4 joined with the Max of Conv1D branches that reach
hundreds, then a BatchNormalization).  One scale on the Concat left the embeddings a few levels: its int8 gave
cosine 0.88 on ort:cpu and 0.28 on openvino:cpu where NNCF's gave 0.999 and 0.998.  The weights are 7-bit
(``reduce_range`` auto) so the bounds hold on AVX2-only CPUs too; OpenVINO runs f32 here (``run_openvino``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper

from qdeploy.graph.utils import node_readers
from qdeploy.stages import quantize
from qdeploy.stages.quantize import CalibrationRef, QuantizeConfig
from qdeploy.stages.quantize.ptq import _ptq
from qdeploy.stages.quantize.ptq._depthwise import MIN_LEVELS
from qdeploy.stages.quantize.ptq._mixed_concats import mixed_range_concats
from qdeploy.stages.quantize.ptq._openvino import float_tail, moved_before_quantizing
from tests.helpers.quantize import cosine, init, make_model, run_openvino, save_artifact, stage_context
from tests.helpers.text_cnn import joined_feeds, joined_text_cnn

OP_TYPES = list(_ptq.BALANCED_OP_TYPES)


def _quantized(tmp_path: Path, runtime: str | None) -> quantize.StageResult:
    folder = tmp_path / "calib"
    folder.mkdir(exist_ok=True)
    for index, sample in enumerate(joined_feeds(8, seed=1)):
        np.savez(folder / f"s{index:02d}.npz", **sample)
    config = QuantizeConfig(calibration=CalibrationRef(data="calib"), verify_targets=[], runtime=runtime)
    return quantize.run(save_artifact(tmp_path, joined_text_cnn()), config, stage_context(tmp_path, {"calib": folder}))


def _logits(model: onnx.ModelProto, runtime: str, tmp_path: Path) -> np.ndarray:
    feeds = joined_feeds(3, seed=7)
    if runtime == "ort":
        session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        return np.concatenate([session.run(["logits"], feed)[0] for feed in feeds])
    position = [output.name for output in model.graph.output].index("logits")
    return np.concatenate([run_openvino(model, feed, tmp_path)[position] for feed in feeds])


def test_a_concat_whose_narrowest_input_would_get_few_levels_is_listed() -> None:
    model = joined_text_cnn()
    ranges = {"a_bn": (-3.0, 3.5), "max_k4": (-40.0, 600.0), "b_emb": (-2.5, 2.0)}
    found = mixed_range_concats(model, ranges, OP_TYPES)
    assert list(found) == ["join"]
    assert found["join"] == pytest.approx(255 * 4.5 / 640, abs=0.01)
    assert found["join"] < MIN_LEVELS
    assert mixed_range_concats(model, {**ranges, "max_k4": (-4.0, 30.0)}, OP_TYPES) == {}  # 33 levels: int8 Concat
    assert mixed_range_concats(model, ranges, OP_TYPES, excluded={"join"}) == {}
    assert mixed_range_concats(model, ranges, [op for op in OP_TYPES if op != "Concat"]) == {}


@pytest.mark.slow
@pytest.mark.parametrize("runtime", [None, "openvino"])
def test_the_joined_text_cnns_int8_holds_on_both_runtimes(tmp_path: Path, runtime: str | None) -> None:
    result = _quantized(tmp_path, runtime)
    assert result.findings.float_concats is not None and list(result.findings.float_concats) == ["join"]
    join = next(node for node in result.model.graph.node if node.op_type == "Concat")
    readers = node_readers(result.model.graph.node)[join.output[0]]
    assert not any(reader.op_type == "QuantizeLinear" for reader in readers)
    reference = _logits(joined_text_cnn(), "ort", tmp_path)
    assert cosine(reference, _logits(result.model, "ort", tmp_path)) > 0.98
    assert cosine(reference, _logits(result.model, "openvino", tmp_path)) > 0.98


def test_openvino_placement_quantizes_a_relu_before_its_transpose() -> None:
    model = joined_text_cnn()
    forced = moved_before_quantizing(model, OP_TYPES)
    # each branch: Conv -> Relu -> Transpose -> Squeeze -> MatMul (int8): the Q goes on the Relu's output
    assert forced == {f"k{k}_{step}" for k in (2, 3, 4) for step in ("to_nhwc", "squeeze")}
    # not after a BatchNormalization's Add (flatten), nor the Unsqueeze/Transpose after a Pad in front of a Conv
    assert moved_before_quantizing(model, OP_TYPES, excluded={"k2_step_matmul"}) == {
        f"k{k}_{step}" for k in (3, 4) for step in ("to_nhwc", "squeeze")}

def _step_dense_chain() -> onnx.ModelProto:
    """x -> MatMul -> Reshape -> Pad -> Max(with y) -> Reshape -> MatMul: the first Reshape and the Pad reach int8
    compute only through the float Max (a Keras TimeDistributed Dense -> ZeroPadding1D -> Maximum)."""
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"], name="step"),
             helper.make_node("Reshape", ["h", "shape3"], ["h3"], name="unflatten"),
             helper.make_node("Pad", ["h3", "pads"], ["padded"], name="pad"),
             helper.make_node("Max", ["padded", "y"], ["merged"], name="merge"),
             helper.make_node("Reshape", ["merged", "shape2"], ["flat"], name="flatten"),
             helper.make_node("MatMul", ["flat", "w2"], ["out"], name="dense")]
    rng = np.random.default_rng(0)
    inits = [init("w1", rng.standard_normal((4, 5))), init("w2", rng.standard_normal((40, 3))),
             init("shape3", [1, 7, 5], np.int64), init("shape2", [1, 40], np.int64),
             init("pads", [0, 0, 0, 0, 1, 0], np.int64)]
    return make_model(nodes, inits, {"x": [7, 4], "y": [1, 8, 5]}, {"out": [1, 3]}, opset=13)


def test_openvino_placement_leaves_movement_float_that_reaches_int8_only_through_a_float_op() -> None:
    model = _step_dense_chain()
    assert set(float_tail(model, OP_TYPES)) == {"unflatten", "pad"}
    assert moved_before_quantizing(model, OP_TYPES) == set()  # the flatten reads the Max, no activation
    # an excluded compute node is read by nothing int8: what leads only to it stays float too
    assert set(float_tail(model, OP_TYPES, excluded={"dense"})) == {"unflatten", "pad", "flatten"}
