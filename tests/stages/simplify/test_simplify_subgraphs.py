"""simplify on control flow and on what its check cannot feed: every graph valid, the interface types kept,
"unchecked" instead of a silent pass, folded scalars of rank 0, check inputs that cannot blow up."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxoptimizer
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from qdeploy.core.context import Artifact, StageContext
from qdeploy.graph.order import scope_problems
from qdeploy.stages.simplify import SimplifyConfig, run
from qdeploy.stages.simplify import _folding as folding
from qdeploy.stages.simplify._check_inputs import bounded_memory, safe_integer_ranges
from qdeploy.stages.simplify._interface import interface_types, restore_interface_types
from tests.control_flow_models import loop_with_outer_reads_model, lstm_branch_model, nested_constant_if_model


def simplify_model(model: onnx.ModelProto, tmp_path: Path, ctx: StageContext, **config: object):
    path = tmp_path / "in.onnx"
    onnx.save(model, path)
    artifact = Artifact(path=path, sidecar=tmp_path / "in.json", key="k", sha256="", size_bytes=path.stat().st_size,
                        stages=("export",), parent=None)
    return run(artifact, SimplifyConfig(**config), ctx)


def _session(model: onnx.ModelProto) -> ort.InferenceSession:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


def _valid(model: onnx.ModelProto) -> None:
    onnx.checker.check_model(model, full_check=True)
    assert scope_problems(model.graph) == []


def test_nested_if_with_a_folded_condition_stays_a_valid_graph(tmp_path: Path, ctx: StageContext) -> None:
    model = nested_constant_if_model()
    result = simplify_model(model, tmp_path, ctx)
    _valid(result.model)  # old code: "Nodes in a graph must be topologically sorted" inside the If
    assert any("constant condition" in note for note in result.findings.notes)
    assert result.findings.check.samples == 3
    x = np.array([1.5, -2.0, 0.25], np.float32)
    original, simplified = _session(model), _session(result.model)
    for c1 in (True, False):
        for c2 in (True, False):
            feeds = {"x": x, "c1": np.array(c1), "c2": np.array(c2)}
            np.testing.assert_array_equal(simplified.run(None, feeds)[0], original.run(None, feeds)[0])


def test_lstm_branches_reading_outer_scope_fold_and_match(tmp_path: Path, ctx: StageContext) -> None:
    model = lstm_branch_model()
    result = simplify_model(model, tmp_path, ctx)
    _valid(result.model)
    branch = result.model.graph.node[2].attribute[0].g
    assert "Add" not in [node.op_type for node in branch.node]  # the constant work inside was folded
    assert not branch.initializer  # folded values inside subgraphs are Constant nodes
    x = np.random.default_rng(0).standard_normal((2, 20, 16)).astype(np.float32)
    for rate in (16000, 8000):  # both branches, though random check inputs only reach one
        feeds = {"x": x, "sr": np.array(rate, np.int64)}
        np.testing.assert_allclose(_session(result.model).run(None, feeds)[0], _session(model).run(None, feeds)[0],
                                   rtol=1e-5, atol=1e-6)


def test_loop_body_with_an_if_and_outer_reads(tmp_path: Path, ctx: StageContext) -> None:
    model = loop_with_outer_reads_model()
    result = simplify_model(model, tmp_path, ctx)
    _valid(result.model)
    x = np.array([1.0, -2.0, 3.0, 0.5], np.float32)
    np.testing.assert_allclose(_session(result.model).run(None, {"x": x})[0], _session(model).run(None, {"x": x})[0])


def _sequence_identity() -> onnx.ModelProto:
    seq = helper.make_tensor_sequence_value_info
    graph = helper.make_graph([helper.make_node("Identity", ["s"], ["t"])], "g",
                              [seq("s", TensorProto.FLOAT, None)], [seq("t", TensorProto.FLOAT, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_sequence_interface_keeps_its_types_and_the_check_says_unchecked(tmp_path: Path, ctx: StageContext) -> None:
    model = _sequence_identity()
    assert onnxoptimizer.optimize(model, []).graph.input[0].type.WhichOneof("value") is None  # the trap itself
    result = simplify_model(model, tmp_path, ctx)
    session = _session(result.model)  # old code: "Model input (s) does not have type information"
    assert [i.type for i in session.get_inputs()] == ["seq(tensor(float))"]
    assert [o.type for o in session.get_outputs()] == ["seq(tensor(float))"]
    assert "'s' (seq(tensor(float)))" in result.findings.check.unchecked


def test_restoring_interface_types_puts_back_lost_ones_and_reports_changed_ones() -> None:
    model = _sequence_identity()
    before = interface_types(model)
    optimized = onnxoptimizer.optimize(model, [])
    repair = restore_interface_types(optimized, before)
    assert repair.restored == ["s: ? -> seq(tensor(float))", "t: ? -> seq(tensor(float))"] and not repair.conflicts
    optimized.graph.input[0].type.CopyFrom(helper.make_tensor_type_proto(TensorProto.FLOAT, [2]))
    assert restore_interface_types(optimized, before).conflicts == ["s: seq(tensor(float)) -> tensor(float)"]


def test_folded_scalars_keep_rank_zero(tmp_path: Path, ctx: StageContext) -> None:
    model = onnx.parser.parse_model("""
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[3,4] x) => (int64 n, float[3,4] y) {
            n = Size(x)
            two = Constant<value = float {2.0}>()
            four = Mul(two, two)
            y = Mul(x, four)
        }""")
    result = simplify_model(model, tmp_path, ctx)  # old code: the check refused int64[1] where int64[] is expected
    assert result.findings.check.samples == 3
    values = {init.name: numpy_helper.to_array(init) for init in result.model.graph.initializer}
    assert values["n"].shape == () and int(values["n"]) == 12
    assert values["four"].shape == ()
    assert folding._as_array(np.float32(3.0)).shape == ()


def test_integer_inputs_that_become_sizes_get_small_values(tmp_path: Path, ctx: StageContext) -> None:
    model = onnx.parser.parse_model("""
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[512,512] x, int64[2] reps, int64[4] pads, int64[2] ids) => (float[?,?] y, float[?,?] z,
                                                                             float[2,512] w) {
            y = Tile(x, reps)
            z = Pad(x, pads)
            w = Gather(x, ids)
        }""")
    assert safe_integer_ranges(model) == {"reps": (1, 4), "pads": (1, 4), "ids": (0, 512)}
    result = simplify_model(model, tmp_path, ctx)  # old code: repeats up to 99 need 100 GB; the check did not run
    assert result.findings.check.samples == 3


def test_the_check_memory_bound_turns_a_runaway_allocation_into_an_error() -> None:
    with bounded_memory(256 * 2**20), pytest.raises(MemoryError):
        np.ones(2**30, np.uint8)
    assert np.ones(2**28, np.uint8).sum() == 2**28  # the bound is gone afterwards


def test_an_optimizer_result_that_breaks_a_subgraph_is_discarded(tmp_path: Path, ctx: StageContext,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    from qdeploy.stages.simplify._optimizer import Optimized

    def breaking(model: onnx.ModelProto, passes: list[str]) -> Optimized:
        broken = onnx.ModelProto()
        broken.CopyFrom(model)
        body = broken.graph.node[-1].attribute[0].g  # the Loop body: its first node goes to the end
        first = onnx.NodeProto()
        first.CopyFrom(body.node[0])
        del body.node[0]
        body.node.append(first)
        body.node[-1].output[0] = "renamed"  # not just an order problem: a read of a name nobody produces
        return Optimized(broken)

    monkeypatch.setattr("qdeploy.stages.simplify._optimizer.optimize", breaking)
    model = loop_with_outer_reads_model()
    result = simplify_model(model, tmp_path, ctx, fold_constants=False)
    _valid(result.model)
    assert any("onnxoptimizer's result was discarded" in note for note in result.findings.notes)


def test_the_check_runs_on_the_recipes_validation_data_when_there_is_some(tmp_path: Path) -> None:
    from qdeploy.pipeline.recipe.schema import Recipe

    data = tmp_path / "val"
    data.mkdir()
    x = np.random.default_rng(1).standard_normal((1, 12, 16)).astype(np.float32)
    np.savez(data / "a.npz", x=x, sr=np.array(16000, np.int64))  # the branch random integers never reach
    recipe = Recipe(name="t", model={"onnx": "m.onnx"}, variants={"v": []},
                    data={"val": {"reader": "npy", "path": str(data)}}, validate={"data": "val"})
    ctx = recipe.stage_context("v", tmp_path / "work")
    result = simplify_model(lstm_branch_model(), tmp_path, ctx)
    check = result.findings.check
    assert check.inputs == "the recipe's validation data" and check.input_shapes == {"x": [1, 12, 16],
                                                                                          "sr": []}


def test_an_inlined_branch_whose_node_names_repeat_its_new_graphs_gets_unique_names(tmp_path: Path,
                                                                                  ctx: StageContext) -> None:
    model = nested_constant_if_model()
    outer_then = next(attr.g for attr in model.graph.node[1].attribute if attr.name == "then_branch")
    for node in outer_then.node:
        node.name = "same"  # the exporter named nodes per graph
    taken = next(attr.g for attr in outer_then.node[-1].attribute if attr.name == "then_branch")
    for node in taken.node:
        node.name = "same"
    result = simplify_model(model, tmp_path, ctx)
    branch = next(attr.g for attr in result.model.graph.node[1].attribute if attr.name == "then_branch")
    names = [node.name for node in branch.node if node.name]
    assert len(names) == len(set(names))
    _session(result.model)


def test_random_check_inputs_take_the_constants_an_input_is_compared_with() -> None:
    from qdeploy.stages.simplify._check_inputs import compared_values, with_compared_values

    model = lstm_branch_model()
    assert compared_values(model) == {"sr": [16000]}  # Equal(sr, 16000) picks the branch
    samples = [{"sr": np.array(5, np.int64)}, {"sr": np.array(7, np.int64)}]
    assert [int(s["sr"]) for s in with_compared_values(iter(samples), compared_values(model))] == [16000, 7]


def test_a_check_past_its_memory_bound_is_unchecked_not_a_crash(tmp_path: Path, ctx: StageContext,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    from qdeploy.stages.simplify import _check as simplify_check

    def no_memory(*args: object, **kwargs: object) -> None:
        raise MemoryError("Unable to allocate 1.62 GiB for an array")

    monkeypatch.setattr(simplify_check, "compare_simplified", no_memory)
    result = simplify_model(loop_with_outer_reads_model(), tmp_path, ctx)  # old code: the MemoryError escaped
    assert "memory bound" in result.findings.check.unchecked


def test_constant_ifs_are_inlined_with_their_constants_and_nested_reads() -> None:
    """Outer If on an initializer, inner If on an outer Constant node, a branch initializer and a body that reads
    the branch's own value: both Ifs go, the result is valid and computes the same."""
    from onnx import TensorProto, helper, numpy_helper

    from qdeploy.stages.simplify._rewrite_if import inline_constant_ifs

    def vi(name: str) -> onnx.ValueInfoProto:
        return helper.make_tensor_value_info(name, TensorProto.FLOAT, [2, 3])

    inner_then = helper.make_graph([helper.make_node("Mul", ["t", "t"], ["u_then"], name="same")], "inner_then", [],
                                   [vi("u_then")])
    inner_else = helper.make_graph([helper.make_node("Neg", ["t"], ["u_else"], name="same")], "inner_else", [],
                                   [vi("u_else")])
    then = helper.make_graph(
        [helper.make_node("Add", ["x", "c"], ["t"], name="same"),
         helper.make_node("If", ["flag2"], ["u"], name="inner", then_branch=inner_then, else_branch=inner_else)],
        "then", [], [vi("u")], [numpy_helper.from_array(np.full((2, 3), 0.5, np.float32), "c")])
    other = helper.make_graph([helper.make_node("Identity", ["x"], ["v"])], "else", [], [vi("v")])
    graph = helper.make_graph(
        [helper.make_node("Constant", [], ["flag2"], name="flag2_node", value=numpy_helper.from_array(np.array(False))),
         helper.make_node("If", ["flag"], ["y"], name="same", then_branch=then, else_branch=other)],
        "g", [vi("x")], [vi("y")], [numpy_helper.from_array(np.array(True), "flag")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    x = np.random.default_rng(2).standard_normal((2, 3)).astype(np.float32)
    expected = _session(model).run(None, {"x": x})[0]

    assert inline_constant_ifs(model) == 1  # the outer one; the inner one moved up with its branch: next pass
    assert inline_constant_ifs(model) == 1  # next call: now in the main graph, its condition a Constant node
    onnx.checker.check_model(model, full_check=True)
    assert "If" not in [node.op_type for node in model.graph.node]
    names = [node.name for node in model.graph.node if node.name]
    assert len(names) == len(set(names))
    np.testing.assert_array_equal(_session(model).run(None, {"x": x})[0], expected)
    np.testing.assert_array_equal(expected, -(x + 0.5))
