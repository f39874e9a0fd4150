"""Activation statistics: the tensors around quantizable ops, their ranges and histograms over streamed data."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from qdeploy.calibration.activations import collect_statistics, float_tensors_of


def two_op_model(path: Path) -> Path:
    """x -> Conv(w) -> c -> Relu -> y ; shapes inferred so the tensors have types."""
    weight = numpy_helper.from_array(np.ones((2, 1, 1, 1), np.float32), "w")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"]), helper.make_node("Relu", ["c"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 2, 2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, 2, 2])], [weight])
    model = onnx.shape_inference.infer_shapes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                                                                ir_version=8))
    onnx.save(model, str(path))
    return path


def test_tensors_of_the_wanted_op_types_without_initializers(tmp_path: Path) -> None:
    path = two_op_model(tmp_path / "m.onnx")
    assert float_tensors_of(path, ["Conv"]) == ["x", "c"]
    assert float_tensors_of(path, ["Relu"]) == ["c", "y"]
    assert float_tensors_of(path) == ["x", "c", "y"]


def test_statistics_span_every_sample_and_each_pass_restarts_the_stream(tmp_path: Path) -> None:
    path = two_op_model(tmp_path / "m.onnx")
    samples = [np.full((1, 1, 2, 2), value, np.float32) for value in (-1.0, 0.5, 3.0)]
    passes = []

    def feeds() -> Iterator[dict[str, np.ndarray]]:
        passes.append(1)
        return iter([{"x": sample} for sample in samples])

    stats, used = collect_statistics(path, ["x", "c", "y"], feeds, tmp_path, histogram=True, bins=16)
    assert used == 3 and len(passes) == 2
    assert (stats["x"].minimum, stats["x"].maximum) == (-1.0, 3.0)
    assert (stats["y"].minimum, stats["y"].maximum) == (0.0, 3.0)  # Relu output
    assert stats["c"].histogram is not None and int(stats["c"].histogram.sum()) == 3 * 8
    assert stats["y"].zeros == 8  # the negative sample's Relu output


def test_one_pass_without_histograms(tmp_path: Path) -> None:
    path = two_op_model(tmp_path / "m.onnx")
    passes = []

    def feeds() -> Iterator[dict[str, np.ndarray]]:
        passes.append(1)
        return iter([{"x": np.ones((1, 1, 2, 2), np.float32)}])

    stats, _ = collect_statistics(path, ["c"], feeds, tmp_path)
    assert len(passes) == 1 and stats["c"].histogram is None and stats["c"].maximum == 1.0
