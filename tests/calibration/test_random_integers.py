"""Seeded random data for integer inputs takes what the graph can take: an embedding index stays inside its table.

Before: calibration and validation drew every integer input from [0, 100) (only the simplify check read the graph),
and a PyTorch embedding over a 4-row table failed int8 and validation ("indices element out of data bounds,
idx=85 must be within the inclusive range [-4,3]")."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from qdeploy.calibration.samples import iter_samples


def _embedding(path: Path) -> Path:
    """ids [2, 6] int64 -> Gather(table [4, 3]) -> Relu -> y, as torch exports nn.Embedding(4, 3)."""
    table = numpy_helper.from_array(np.arange(12, dtype=np.float32).reshape(4, 3), "table")
    graph = helper.make_graph([helper.make_node("Gather", ["table", "ids"], ["e"]),
                               helper.make_node("Relu", ["e"], ["y"])], "g",
                              [helper.make_tensor_value_info("ids", TensorProto.INT64, [2, 6])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 6, 3])], [table])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def test_random_indices_stay_inside_the_table_they_index_and_the_model_runs(tmp_path: Path) -> None:
    model = _embedding(tmp_path / "m.onnx")
    samples = list(iter_samples(None, model, limit=8))
    ids = np.stack([sample["ids"] for sample in samples])
    assert ids.min() >= 0 and ids.max() <= 3 and len(np.unique(ids)) == 4
    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    for sample in samples:
        session.run(None, sample)


def test_the_recipes_low_and_high_win_over_the_graphs(tmp_path: Path) -> None:
    model = _embedding(tmp_path / "m.onnx")
    samples = list(iter_samples(None, model, ranges={"ids": (2, 3)}, limit=4))
    assert all((sample["ids"] == 2).all() for sample in samples)
