"""A mask added as -Inf stays float (chython-rxnmap's attention: a distance table whose first row is -Inf, gathered
and added to the scores).  Before: the Gather's table quantized to an infinite scale and NaN on OpenVINO, and the
masked scores saturated to the range's low end on ONNX Runtime, so masked positions took weight again."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

from qdeploy.stages import quantize
from qdeploy.stages.quantize import QuantizeConfig
from qdeploy.stages.quantize.ptq._nonfinite import nonfinite_nodes
from tests.helpers.quantize import cosine, init, make_model, run_openvino, run_ort, save_artifact, stage_context


def _masked_attention() -> onnx.ModelProto:
    """x [1, 6, 8], rows [6] -> softmax(x Wq (x Wk)^T + table[rows]) x: the mask gathered from a table holding -Inf
    by an input, as rxnmap gathers it by the distances it is given."""
    rng = np.random.default_rng(0)
    table = np.zeros((3, 6), np.float32)
    table[0, 3:] = -np.inf  # row 0 hides the last three keys
    table[2, :2] = -np.inf
    nodes = [helper.make_node("MatMul", ["x", "wq"], ["q"], name="q"),
             helper.make_node("MatMul", ["x", "wk"], ["k"], name="k"),
             helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 2, 1], name="kt"),
             helper.make_node("MatMul", ["q", "kt"], ["scores"], name="scores"),
             helper.make_node("Gather", ["table", "rows"], ["mask"], axis=0, name="mask"),
             helper.make_node("Add", ["scores", "mask"], ["masked"], name="masked"),
             helper.make_node("Softmax", ["masked"], ["p"], axis=-1, name="softmax"),
             helper.make_node("MatMul", ["p", "x"], ["y"], name="y")]
    weights = [init("wq", rng.normal(0, 0.4, (8, 8))), init("wk", rng.normal(0, 0.4, (8, 8))), init("table", table)]
    model = make_model(nodes, weights, {"x": [1, 6, 8]}, {"y": [1, 6, 8]})
    model.graph.input.append(helper.make_tensor_value_info("rows", TensorProto.INT64, [6]))
    return model


def _feed(seed: int) -> dict[str, np.ndarray]:
    return {"x": np.random.default_rng(seed).normal(size=(1, 6, 8)).astype(np.float32),
            "rows": np.array([0, 2, 1, 1, 0, 1], np.int64)}


def test_a_minus_inf_mask_stays_float_and_the_int8_model_keeps_its_masking(tmp_path: Path) -> None:
    model = _masked_attention()
    context = dataclasses.replace(stage_context(tmp_path), variant="int8@ort", targets=("ort:cpu", "openvino:cpu"))
    result = quantize.run(save_artifact(tmp_path, model), QuantizeConfig(mode="ptq", runtime="ort",
                                                                          calibration={"samples": 4}), context)
    feed = _feed(1)
    want = run_ort(model, feed)[0]
    for got in (run_ort(result.model, feed)[0], run_openvino(result.model, feed, tmp_path)[0]):
        assert np.isfinite(got).all() and cosine(got, want) > 0.99
    kept = result.report()["nonfinite_float"]
    assert {"mask", "masked"} <= set(kept) and kept["mask"] == "mask"
    assert "q" not in kept  # the rest quantizes
    assert any(node.op_type == "QuantizeLinear" for node in result.model.graph.node)


def test_a_constant_holding_minus_inf_keeps_its_reader_float_when_no_sample_gathered_it(tmp_path: Path) -> None:
    """Rows 0 and 2 hold -Inf: with no sample gathering them calibration sees no Inf, and the table alone says so."""
    model = _masked_attention()
    onnx.save(model, tmp_path / "m.onnx")
    assert nonfinite_nodes(model, [], ["Gather", "MatMul"], tmp_path) == {"mask": "table"}
    assert nonfinite_nodes(model, [], ["MatMul"], tmp_path) == {}  # a Gather it does not quantize reads it
