"""Seeded random data for integer inputs takes what the graph can take: an embedding index stays inside its table.

Before: calibration and validation drew every integer input from [0, 100) (only the simplify check read the graph),
and a PyTorch embedding over a 4-row table failed int8 and validation ("indices element out of data bounds,
idx=85 must be within the inclusive range [-4,3]")."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from qdeploy.calibration.samples import iter_samples
from qdeploy.core.errors import DataError
from qdeploy.targets import get_target


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


def _message_passing(path: Path) -> Path:
    """A graph network's step, as torch_geometric exports one: node features pos [num_atoms, 3] (symbolic), an edge
    list edge_index [2, num_edges]; each edge gathers its source's features and scatters them onto its target."""
    zero, one = (numpy_helper.from_array(np.array(value, np.int64), name) for value, name in ((0, "zero"), (1, "one")))
    shape = numpy_helper.from_array(np.array([1, 3], np.int64), "shape")
    nodes = [helper.make_node("Gather", ["edge_index", "zero"], ["source"], axis=0),
             helper.make_node("Gather", ["edge_index", "one"], ["target"], axis=0),
             helper.make_node("Gather", ["pos", "source"], ["message"], axis=0),
             helper.make_node("Unsqueeze", ["target", "one"], ["target_column"]),
             helper.make_node("Expand", ["target_column", "shape"], ["where"]),
             helper.make_node("ScatterElements", ["pos", "where", "message"], ["y"], axis=0, reduction="add")]
    graph = helper.make_graph(nodes, "g", [
        helper.make_tensor_value_info("pos", TensorProto.FLOAT, ["num_atoms", 3]),
        helper.make_tensor_value_info("edge_index", TensorProto.INT64, [2, "num_edges"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["num_atoms", 3])], [zero, one, shape])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), path)
    return path


def test_an_edge_list_into_symbolic_node_features_stays_inside_them(tmp_path: Path) -> None:
    """caustic-nmr's PaiNN and minimol: the table is the graph's own tensor, [num_atoms, 3]; random data sets
    num_atoms to 1, so 0 is the only index that exists (before: [0, 100), 'indices element out of data bounds')."""
    model = _message_passing(tmp_path / "m.onnx")
    samples = list(iter_samples(None, model, limit=4))
    assert all((sample["edge_index"] == 0).all() for sample in samples)
    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    for sample in samples:
        session.run(None, sample)


def test_a_declared_node_count_widens_the_edge_list_to_it(tmp_path: Path) -> None:
    """With the nodes' count fixed (as model.inputs' shapes fix it), indices take every node."""
    model = onnx.load(_message_passing(tmp_path / "m.onnx"))
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_value = 5
    onnx.save(model, tmp_path / "fixed.onnx")
    edges = np.concatenate([sample["edge_index"] for sample in iter_samples(None, tmp_path / "fixed.onnx", limit=8)],
                           axis=1)
    assert edges.min() == 0 and edges.max() == 4


def _masked(path: Path) -> Path:
    graph = helper.make_graph([helper.make_node("Not", ["mask"], ["y"])], "g",
                              [helper.make_tensor_value_info("mask", TensorProto.BOOL, [4, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.BOOL, [4, 16])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def test_a_bool_input_takes_low_one_as_all_true(tmp_path: Path) -> None:
    model = _masked(tmp_path / "m.onnx")
    assert all(sample["mask"].all() for sample in iter_samples(None, model, ranges={"mask": (1, None)}, limit=3))
    mixed = np.stack([sample["mask"] for sample in iter_samples(None, model, limit=3)])
    assert 0.3 < mixed.mean() < 0.7  # the default: half and half


def _keras_lookup(path: Path, offset: bool = False) -> Path:
    """tf2onnx's Keras embedding lookup: ids -> ids * (ids >= 0) + (ids < 0) * (ids + 49) -> Gather(table [49, 3]);
    with ``offset``, ids + 2 -> Gather instead (a position offset: not the ids' own values)."""
    table = numpy_helper.from_array(np.zeros((49, 3), np.float32), "table")
    consts = [numpy_helper.from_array(np.array(value, np.int32), name) for name, value in
              (("zero", 0), ("rows", 49), ("two", 2))]
    if offset:
        nodes = [helper.make_node("Add", ["ids", "two"], ["index"])]
    else:
        nodes = [helper.make_node("Less", ["ids", "zero"], ["negative"]),
                 helper.make_node("Not", ["negative"], ["positive"]),
                 helper.make_node("Cast", ["positive"], ["keep"], to=TensorProto.INT32),
                 helper.make_node("Cast", ["negative"], ["wrap"], to=TensorProto.INT32),
                 helper.make_node("Mul", ["ids", "keep"], ["kept"]),
                 helper.make_node("Add", ["ids", "rows"], ["shifted"]),
                 helper.make_node("Mul", ["wrap", "shifted"], ["wrapped"]),
                 helper.make_node("Add", ["wrapped", "kept"], ["index"])]
    nodes.append(helper.make_node("Gather", ["table", "index"], ["y"]))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("ids", TensorProto.INT32, [1, 20])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 20, 3])], [table, *consts])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def test_a_keras_lookup_written_by_tf2onnx_keeps_its_ids_inside_the_table(tmp_path: Path) -> None:
    """slovorez: before, the ids took [0, 100) and the 49-row table refused them ("idx=83 must be within the
    inclusive range [-49,48]")."""
    model = _keras_lookup(tmp_path / "m.onnx")
    samples = list(iter_samples(None, model, limit=4))
    ids = np.concatenate([sample["ids"] for sample in samples])
    assert ids.min() >= 0 and ids.max() <= 48 and ids.max() > 30
    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    for sample in samples:
        session.run(None, sample)
    offset = list(iter_samples(None, _keras_lookup(tmp_path / "offset.onnx", offset=True), limit=4))
    assert max(sample["ids"].max() for sample in offset) > 48  # x + 2 is not x: the graph says nothing of it


def test_an_index_past_its_table_says_what_to_do_about_it(tmp_path: Path) -> None:
    """Not "the feeds do not fit" alone: the shapes fit, an integer input's values do not."""
    session = get_target("ort:cpu").load(_embedding(tmp_path / "m.onnx"))
    with pytest.raises(DataError, match=r"out of data bounds.*give it low/high in model\.inputs"):
        session.run({"ids": np.full((2, 6), 9, np.int64)})
    session.close()
