"""The simplify stage's subgraph folding, partial shapes, light onnxoptimizer runs, check inputs and findings."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxoptimizer
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from qdeploy.core.context import StageContext
from qdeploy.graph.light import light_bytes, light_copy, restore
from qdeploy.stages.simplify import _optimizer as optimizer
from qdeploy.stages.simplify._check_inputs import safe_integer_ranges
from qdeploy.stages.simplify._folding import constant_node_tensors
from qdeploy.stages.simplify.config import DEFAULT_PASSES
from tests.helpers.models import tiny_cnn
from tests.helpers.simplify import simplify_model

RNG = np.random.default_rng(1)


def _run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)


def _vi(name: str, shape: list[int | str] | None, elem: int = TensorProto.FLOAT) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, shape)


def _nested_if_model() -> onnx.ModelProto:
    """If inside If; the inner then-branch computes (w*w + 1) from an outer constant: foldable in place."""
    inner_then = helper.make_graph([helper.make_node("Mul", ["w", "w"], ["ww"]),
                                    helper.make_node("Add", ["ww", "one"], ["ww1"]),
                                    helper.make_node("Add", ["x", "ww1"], ["it"])], "inner_then", [],
                                   [_vi("it", [3])], [numpy_helper.from_array(np.ones(3, np.float32), "one")])
    inner_else = helper.make_graph([helper.make_node("Sub", ["x", "w"], ["ie"])], "inner_else", [], [_vi("ie", [3])])
    outer_then = helper.make_graph([helper.make_node("If", ["c2"], ["ot"], then_branch=inner_then,
                                                     else_branch=inner_else)], "outer_then", [], [_vi("ot", [3])])
    outer_else = helper.make_graph([helper.make_node("Identity", ["x"], ["x_copy"]),
                                    helper.make_node("Neg", ["x_copy"], ["oe"])], "outer_else", [], [_vi("oe", [3])])
    node = helper.make_node("If", ["c1"], ["y"], then_branch=outer_then, else_branch=outer_else)
    graph = helper.make_graph([node], "g", [_vi("x", [3]), _vi("c1", [], TensorProto.BOOL),
                                            _vi("c2", [], TensorProto.BOOL)], [_vi("y", [3])],
                              [numpy_helper.from_array(np.array([1.0, -2.0, 0.5], np.float32), "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _inner_then(model: onnx.ModelProto) -> onnx.GraphProto:
    outer_then = next(attr.g for attr in model.graph.node[0].attribute if attr.name == "then_branch")
    return next(attr.g for attr in outer_then.node[0].attribute if attr.name == "then_branch")


@pytest.mark.parametrize("fold_subgraphs", [True, False])
def test_if_inside_if_is_folded_inside_or_kept_and_never_broken(tmp_path: Path, ctx: StageContext,
                                                                 fold_subgraphs: bool) -> None:
    model = _nested_if_model()
    result = simplify_model(model, tmp_path, ctx, fold_subgraphs=fold_subgraphs)
    inner = [node.op_type for node in _inner_then(result.model).node]
    # Folded values inside subgraphs are Constant nodes: tools (onnxoptimizer inlining a branch) drop subgraph
    # initializers.
    assert inner == (["Constant", "Add"] if fold_subgraphs else ["Constant", "Mul", "Add", "Add"])
    assert not _inner_then(result.model).initializer
    if fold_subgraphs:
        folded = {name: numpy_helper.to_array(tensor)
                  for name, tensor in constant_node_tensors(_inner_then(result.model)).items()}
        np.testing.assert_array_equal(folded["ww1"], [2.0, 5.0, 1.25])
    assert result.findings.check.samples == 3
    x = RNG.standard_normal(3).astype(np.float32)
    for c1 in (True, False):
        for c2 in (True, False):
            feeds = {"x": x, "c1": np.array(c1), "c2": np.array(c2)}
            np.testing.assert_array_equal(_run(result.model, feeds)[0], _run(model, feeds)[0])


def test_loop_invariant_constant_work_in_a_loop_body_is_folded(tmp_path: Path, ctx: StageContext) -> None:
    body = helper.make_graph(
        [helper.make_node("Mul", ["k", "k"], ["kk"]), helper.make_node("Add", ["acc", "kk"], ["acc_out"]),
         helper.make_node("Identity", ["cond"], ["cond_out"])], "body",
        [_vi("i", [], TensorProto.INT64), _vi("cond", [], TensorProto.BOOL), _vi("acc", [2])],
        [_vi("cond_out", [], TensorProto.BOOL), _vi("acc_out", [2])])
    node = helper.make_node("Loop", ["n", "", "x"], ["y"], body=body)
    graph = helper.make_graph([node], "g", [_vi("x", [2])], [_vi("y", [2])],
                              [numpy_helper.from_array(np.array(4, np.int64), "n"),
                               numpy_helper.from_array(np.array([1.5, -1.0], np.float32), "k")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    result = simplify_model(model, tmp_path, ctx)
    body_ops = [n.op_type for n in result.model.graph.node[0].attribute[0].g.node]
    assert "Mul" not in body_ops and "Add" in body_ops
    x = RNG.standard_normal(2).astype(np.float32)
    np.testing.assert_allclose(_run(result.model, {"x": x})[0], x + 4 * np.array([2.25, 1.0], np.float32))


def test_static_dimensions_of_a_partly_symbolic_shape_fold(tmp_path: Path, ctx: StageContext) -> None:
    model = onnx.parser.parse_model("""
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[N,4,6] x) => (float[N,24] y) {
            s = Shape(x)
            i12 = Constant<value = int64[2] {1, 2}>()
            dims = Gather<axis = 0>(s, i12)
            st = Constant<value = int64[1] {1}>()
            en = Constant<value = int64[1] {3}>()
            dims2 = Slice(s, st, en)
            prod = ReduceProd<keepdims = 1>(dims)
            minus1 = Constant<value = int64[1] {-1}>()
            target = Concat<axis = 0>(minus1, prod)
            y = Reshape(x, target)
            z = Reshape(x, dims2)
        }""")
    model.graph.node[-1].output[0] = "z_unused"  # dims2 folds too; z is dead and goes away
    result = simplify_model(model, tmp_path, ctx)
    assert [node.op_type for node in result.model.graph.node] == ["Reshape"]
    x = RNG.standard_normal((5, 4, 6)).astype(np.float32)
    np.testing.assert_array_equal(_run(result.model, {"x": x})[0], x.reshape(5, 24))


def test_light_onnxoptimizer_run_gives_the_full_runs_model() -> None:
    model = tiny_cnn(channels=64)  # 64*3*3*3 float32 weights: above the size that travels as a tag
    model.graph.initializer.append(numpy_helper.from_array(numpy_helper.to_array(model.graph.initializer[0]), "dup"))
    model.graph.node.append(helper.make_node("Conv", ["input", "dup"], ["dup_out"], pads=[1, 1, 1, 1]))
    model.graph.output.append(_vi("dup_out", [1, 64, 16, 16]))
    passes = list(DEFAULT_PASSES)
    full = onnxoptimizer.optimize(model, passes, fixed_point=True)
    before = model.SerializeToString()
    result = optimizer.optimize(model, passes)
    assert result.light is not None and result.model.ByteSize() < model.ByteSize() / 4  # ran without the weights
    assert model.SerializeToString() != before  # duplicates merged in the input, which is otherwise as it was
    weights = {init.name: init.raw_data for init in model.graph.initializer}
    light = result.into(model)
    assert light is model  # the full model takes the optimized graph: its weights are not copied
    assert "dup" not in {init.name for init in light.graph.initializer}  # duplicates merged
    kept = {init.name: init.raw_data for init in light.graph.initializer if init.name in weights}
    assert kept and all(weights[name] == raw for name, raw in kept.items())
    assert [node.op_type for node in light.graph.node] == [node.op_type for node in full.graph.node]
    feeds = {"input": RNG.standard_normal((1, 3, 16, 16)).astype(np.float32)}
    for want, got in zip(_run(full, feeds), _run(light, feeds), strict=True):
        np.testing.assert_array_equal(got, want)


def test_light_copy_leaves_the_bytes_behind_and_restore_brings_them_back() -> None:
    model = tiny_cnn(channels=64)
    light = light_copy(model)
    assert light.model.ByteSize() < model.ByteSize() / 4
    assert abs(light_bytes(light) - light.model.ByteSize()) < 512  # what a size check must see, not the tags' dims
    assert restore(light.model, light) == []
    assert {init.name: numpy_helper.to_array(init).tobytes() for init in light.model.graph.initializer} == \
        {init.name: numpy_helper.to_array(init).tobytes() for init in model.graph.initializer}


def test_one_onnxoptimizer_call_and_findings_name_what_changed(tmp_path: Path, ctx: StageContext) -> None:
    model = tiny_cnn()
    model.graph.node[-1].output[0] = "pre"
    model.graph.node.append(helper.make_node("Identity", ["pre"], ["logits"]))
    result = simplify_model(model, tmp_path, ctx)
    findings = result.findings
    assert findings.optimizer.calls == 1
    assert findings.rewrites.applied == {"fuse_conv_batchnorm": 1}
    assert {"fuse_conv_batchnorm", "eliminate_identity"} <= set(findings.passes_changed)
    assert findings.optimizer.removed == {"Identity": 1}
    assert set(findings.seconds) >= {"shape_inference", "folding", "rewrites", "onnxoptimizer", "check"}
    assert findings.nodes_after == {"Conv": 1, "Flatten": 1, "Gemm": 1, "GlobalAveragePool": 1, "Relu": 1}


def test_folded_tensors_are_listed_with_their_bytes(tmp_path: Path, ctx: StageContext) -> None:
    model = onnx.parser.parse_model("""
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[2,3] x) => (float[2,3] y) {
            a = Constant<value = float[3] {1, 2, 3}>()
            b = Mul(a, a)
            y = Add(x, b)
        }""")
    result = simplify_model(model, tmp_path, ctx)
    assert result.findings.folded == {"b": 12}
    assert result.findings.constants_converted == 1


def _embedding_model(vocab: int) -> onnx.ModelProto:
    table = numpy_helper.from_array(RNG.standard_normal((vocab, 8)).astype(np.float32), "table")
    nodes = [helper.make_node("Gather", ["table", "ids"], ["emb"]),
             helper.make_node("ReduceMean", ["emb"], ["y"], axes=[1], keepdims=0)]
    graph = helper.make_graph(nodes, "g", [_vi("ids", ["batch", "seq"], TensorProto.INT64)], [_vi("y", ["batch", 8])],
                              [table])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def test_token_ids_get_values_within_the_embedding_table(tmp_path: Path, ctx: StageContext) -> None:
    model = _embedding_model(vocab=7)  # the default 0..99 would index past the table
    assert safe_integer_ranges(model) == {"ids": (0, 7)}
    result = simplify_model(model, tmp_path, ctx)
    check = result.findings.check
    assert check.samples == 3, check
    assert check.input_shapes == {"ids": [1, 32]}  # batch 1, other symbolic dimensions 32


def test_a_symbolic_size_the_original_refuses_is_retried_with_one(tmp_path: Path, ctx: StageContext) -> None:
    model = onnx.parser.parse_model("""
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[N,M] x) => (float[N,1] y) {
            shape = Constant<value = int64[2] {1, 1}>()
            y = Reshape(x, shape)
        }""")  # only M = 1 works
    result = simplify_model(model, tmp_path, ctx)
    assert result.findings.check.input_shapes == {"x": [1, 1]}


def _conv_bn_chain(blocks: int) -> onnx.ModelProto:
    """Conv -> BatchNormalization -> Identity -> Relu, ``blocks`` times (onnxoptimizer fuses each BN)."""
    nodes, inits, h = [], [], "x"
    for i in range(blocks):
        inits += [numpy_helper.from_array(RNG.standard_normal((4, 4, 1, 1)).astype(np.float32) * 0.5, f"w{i}")]
        inits += [numpy_helper.from_array(RNG.uniform(0.5, 1.5, 4).astype(np.float32), f"{p}{i}")
                  for p in ("g", "b", "m", "v")]
        nodes += [helper.make_node("Conv", [h, f"w{i}"], [f"c{i}"]),
                  helper.make_node("BatchNormalization", [f"c{i}", f"g{i}", f"b{i}", f"m{i}", f"v{i}"], [f"n{i}"]),
                  helper.make_node("Identity", [f"n{i}"], [f"i{i}"]), helper.make_node("Relu", [f"i{i}"], [f"r{i}"])]
        h = f"r{i}"
    graph = helper.make_graph(nodes, "chain", [_vi("x", [1, 4, 5, 5])], [_vi(h, [1, 4, 5, 5])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def test_a_large_graph_goes_through_onnxoptimizer_in_pieces(tmp_path: Path, ctx: StageContext,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    from qdeploy.stages.simplify import _optimizer_pieces as optimizer_pieces

    monkeypatch.setattr(optimizer, "PIECES_ABOVE", 10)
    monkeypatch.setattr(optimizer_pieces, "PIECE_NODES", 6)  # pieces end mid-block: patterns straddle them
    model = _conv_bn_chain(8)
    pieces = optimizer_pieces.optimize_in_pieces(model, list(DEFAULT_PASSES), piece_nodes=6)
    names = [name for node in pieces.graph.node for name in node.output] + [i.name for i in pieces.graph.initializer]
    assert len(names) == len(set(names))  # the names onnxoptimizer invents in each piece do not collide
    result = simplify_model(model, tmp_path, ctx, rewrites=[])  # BN fusion left to onnxoptimizer, piece by piece
    ops = [node.op_type for node in result.model.graph.node]
    assert "Identity" not in ops and "BatchNormalization" not in ops and ops.count("Conv") == 8
    assert any("pieces" in note for note in result.findings.notes)
    x = RNG.standard_normal((1, 4, 5, 5)).astype(np.float32)
    np.testing.assert_allclose(_run(result.model, {"x": x})[0], _run(model, {"x": x})[0], rtol=1e-4, atol=1e-5)
