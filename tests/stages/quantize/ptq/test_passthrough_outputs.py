"""A graph input that is also a graph output (a detector passing its image size through, say): ORT's quantizer put
Q/DQ on the input and failed ("AssertionError: Graph is not a DAG").  The output is left out for the quantizer and
listed again, in place (``_prepare.for_quantizer`` / ``give_back``)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from qdeploy.stages import quantize
from qdeploy.stages.quantize import QuantizeConfig
from tests.helpers.quantize import cosine, init, run_ort, save_artifact, stage_context


def passthrough_model() -> onnx.ModelProto:
    """x -> Conv -> Relu -> y; the outputs are y, x itself and a weight."""
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], name="conv"),
             helper.make_node("Relu", ["c"], ["y"], name="relu")]
    weights = [init("w", rng.standard_normal((8, 3, 3, 3)) / 3), init("anchors", rng.standard_normal((1, 8)))]
    graph = helper.make_graph(nodes, "passthrough", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                                   [1, 3, 16, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 16, 16]),
                               helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16]),
                               helper.make_tensor_value_info("anchors", TensorProto.FLOAT, [1, 8])], weights)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


@pytest.mark.parametrize("engine", ["qdeploy", "nncf"])
def test_an_input_passed_straight_out_survives_quantization_in_place(tmp_path: Path, engine: str,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    if engine == "nncf":
        pytest.importorskip("nncf")
    context = dataclasses.replace(stage_context(tmp_path, ranges={"x": (-1.0, 1.0)}), variant="int8",
                                  targets=("ort:cpu",))
    config = QuantizeConfig(mode="ptq", **({"engine": "nncf"} if engine == "nncf" else {}))
    model = quantize.run(save_artifact(tmp_path, passthrough_model()), config, context).model
    assert [value.name for value in model.graph.output] == ["y", "x", "anchors"]
    feed = {"x": np.random.default_rng(1).uniform(-1, 1, (1, 3, 16, 16)).astype(np.float32)}
    y, x, anchors = run_ort(model, feed)
    source = run_ort(passthrough_model(), feed)
    np.testing.assert_array_equal(x, feed["x"])  # the raw input, not its quantized copy
    np.testing.assert_array_equal(anchors, source[2])
    assert cosine(y, source[0]) > 0.99
    assert any(node.op_type == "DequantizeLinear" for node in model.graph.node)
    assert "Statistics collection" not in capsys.readouterr().out  # NNCF's progress bars: not qdeploy's display
