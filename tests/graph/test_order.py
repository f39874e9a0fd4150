"""The one topological sort (``qdeploy.graph.order.sort_topologically``), which simplify, the guard and the fp16
repair share: the fp16 copy raised on a cycle, simplify's kept a cycle at the end; ``strict`` keeps both."""

from __future__ import annotations

import onnx
import pytest
from onnx import TensorProto, helper

from qdeploy.graph.order import outer_references, scope_problems, sort_topologically


def _tensor(name: str, elem: int = TensorProto.FLOAT) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, [1])


def _cycle() -> onnx.GraphProto:
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="first"),
             helper.make_node("Add", ["a", "c"], ["b"], name="loop_b"),
             helper.make_node("Neg", ["b"], ["c"], name="loop_c"),
             helper.make_node("Identity", ["b"], ["y"], name="last")]
    return helper.make_graph(nodes, "g", [_tensor("x")], [_tensor("y")])


def test_the_sort_accounts_for_subgraph_references() -> None:
    branch = helper.make_graph([helper.make_node("Identity", ["late"], ["out"], name="use")], "b", [],
                               [_tensor("out")])
    graph = helper.make_graph(
        [helper.make_node("If", ["cond"], ["y"], name="if", then_branch=branch, else_branch=branch),
         helper.make_node("Relu", ["x"], ["late"], name="made_late")],
        "g", [_tensor("x"), _tensor("cond", TensorProto.BOOL)], [_tensor("y")])
    assert outer_references(branch) == {"late"}
    assert sort_topologically(graph, strict=True)
    assert [node.name for node in graph.node] == ["made_late", "if"]
    assert not sort_topologically(graph)  # sorted already: nothing moves


def test_the_sort_is_stable_among_ready_nodes() -> None:
    nodes = [helper.make_node("Neg", ["b"], ["y"], name="reads_b"), helper.make_node("Relu", ["x"], ["a"], name="a"),
             helper.make_node("Abs", ["x"], ["b"], name="b")]
    graph = helper.make_graph(nodes, "g", [_tensor("x")], [_tensor("y")])
    sort_topologically(graph)
    assert [node.name for node in graph.node] == ["a", "b", "reads_b"]


def test_a_cycle_stays_at_the_end_for_scope_problems_to_name() -> None:
    """Simplify's meaning: the graph came from outside, so the cycle is reported, not raised."""
    graph = _cycle()
    sort_topologically(graph)
    assert [node.name for node in graph.node] == ["first", "loop_b", "loop_c", "last"]
    assert scope_problems(graph)  # the reads of the cycle are named


def test_a_strict_sort_raises_on_a_cycle_naming_its_nodes() -> None:
    """The fp16 repair's meaning: it built the graph itself, so a cycle is a bug to stop at."""
    with pytest.raises(ValueError, match=r"cycle through nodes \['loop_b', 'loop_c', 'last'\]"):
        sort_topologically(_cycle(), strict=True)
