"""Graph helpers that large models lean on."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import qdeploy.graph.utils as graph_utils


@pytest.mark.parametrize("stored", ["raw_data", "float_data"])
def test_float32_chunks_hand_out_every_value_once_in_order(monkeypatch: pytest.MonkeyPatch, stored: str) -> None:
    monkeypatch.setattr(graph_utils, "CHUNK_VALUES", 7)  # pieces of 7 over 20 values: 7, 7, 6
    values = np.arange(20, dtype=np.float32).reshape(4, 5) - 3.5
    tensor = (numpy_helper.from_array(values, "w") if stored == "raw_data"
              else helper.make_tensor("w", TensorProto.FLOAT, values.shape, values.ravel().tolist()))
    chunks = list(graph_utils.float32_chunks(tensor))
    assert [chunk.size for chunk in chunks] == [7, 7, 6]
    np.testing.assert_array_equal(np.concatenate(chunks), values.ravel())


def _with_value_info() -> onnx.ModelProto:
    """y is produced, x is only read (a graph input), gone is neither; the branch has the same three."""
    vi = helper.make_tensor_value_info
    branch = helper.make_graph([helper.make_node("Neg", ["x"], ["inner"])], "then", [], [vi("inner", 1, [1])],
                               value_info=[vi("inner", 1, [1]), vi("x", 1, [1]), vi("inner_gone", 1, [1])])
    nodes = [helper.make_node("Relu", ["x"], ["y"]),
             helper.make_node("If", ["cond"], ["z"], then_branch=branch, else_branch=branch)]
    graph = helper.make_graph(nodes, "g", [vi("x", 1, [1]), vi("cond", TensorProto.BOOL, [])],
                              [vi("z", 1, [1])], value_info=[vi("y", 1, [1]), vi("x", 1, [1]), vi("gone", 1, [1])])
    return helper.make_model(graph)


def _names(graph: onnx.GraphProto) -> list[str]:
    return [value.name for value in graph.value_info]


def test_the_two_value_info_prunings_differ_in_what_they_keep_and_where() -> None:
    """One name each: simplify's drops what no node produces, top level only; the fp16 repair's keeps what a
    node reads too, in every graph."""
    unproduced = _with_value_info()
    graph_utils.prune_unproduced_value_info(unproduced)
    assert _names(unproduced.graph) == ["y"]
    branch = unproduced.graph.node[1].attribute[0].g
    assert _names(branch) == ["inner", "x", "inner_gone"]  # subgraphs untouched
    unused = _with_value_info()
    graph_utils.prune_unused_value_info_recursive(unused.graph)
    assert _names(unused.graph) == ["y", "x"]
    assert _names(unused.graph.node[1].attribute[0].g) == ["inner", "x"]


def test_fresh_names_count_from_two_or_from_where_a_pass_always_counted() -> None:
    taken = {"w", "w_2"}
    assert graph_utils.fresh_name("w", taken) == "w_3" and "w_3" in taken
    assert graph_utils.fresh_name("n", {"n"}, first=1) == "n_1"  # the fp16 stage's node names, as before
    assert graph_utils.fresh_name("new", set()) == "new"
