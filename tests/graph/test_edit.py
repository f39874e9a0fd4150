"""The shared graph editor: edits written back into the model's own message, nothing else touched or copied."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from qdeploy.graph.edit import editing
from qdeploy.graph.rewrites import RewriteReport, apply_rewrites
from tests.helpers.peak import peak_mib

RNG = np.random.default_rng(0)


def _conv_bn_model(*, subgraph_reads_conv: bool = False) -> onnx.ModelProto:
    """x -> Conv -> BatchNormalization -> Relu -> MatMul(other weight) -> y; optionally an If reads the conv."""
    inits = [numpy_helper.from_array(RNG.normal(size=shape).astype(np.float32), name) for name, shape in
             (("w", (4, 3, 3, 3)), ("other", (6, 5)))]
    inits += [numpy_helper.from_array(RNG.uniform(0.5, 1.5, 4).astype(np.float32), name)
              for name in ("gamma", "beta", "mean", "var")]
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c", "gamma", "beta", "mean", "var"], ["b"], name="bn"),
             helper.make_node("Relu", ["b"], ["r"], name="relu"),
             helper.make_node("MatMul", ["r", "other"], ["y"], name="matmul")]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 6, 5])]
    if subgraph_reads_conv:
        branch = helper.make_graph([helper.make_node("Identity", ["c"], ["seen"])], "branch", [],
                                   [helper.make_tensor_value_info("seen", TensorProto.FLOAT, None)])
        nodes.append(helper.make_node("If", ["flag"], ["from_if"], name="if", then_branch=branch, else_branch=branch))
        inits.append(numpy_helper.from_array(np.array(True), "flag"))
        outputs.append(helper.make_tensor_value_info("from_if", TensorProto.FLOAT, None))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 6, 6])],
                              outputs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _run(model: onnx.ModelProto, x: np.ndarray) -> list[np.ndarray]:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})


def test_a_rewrite_writes_back_only_what_it_changed() -> None:
    model = _conv_bn_model()
    before = onnx.ModelProto()
    before.CopyFrom(model)
    x = RNG.normal(size=(1, 3, 6, 6)).astype(np.float32)

    assert apply_rewrites(model, ["fuse_conv_batchnorm"], RewriteReport()) == 1

    onnx.checker.check_model(model, full_check=True)
    assert [node.op_type for node in model.graph.node] == ["Conv", "Relu", "MatMul"]
    assert model.graph.node[0].name == "conv" and model.graph.node[0].output[0] == "b"  # BN's name lives on
    names = {init.name for init in model.graph.initializer}
    assert not names & {"w", "gamma", "beta", "mean", "var"}, "weights only the fused nodes read must go"
    untouched = {init.name: init for init in before.graph.initializer}["other"]
    assert {init.name: init for init in model.graph.initializer}["other"] == untouched
    assert model.graph.node[1] == before.graph.node[2] and model.graph.node[2] == before.graph.node[3]
    np.testing.assert_allclose(_run(model, x)[0], _run(before, x)[0], rtol=1e-5, atol=1e-5)


def test_a_conv_a_subgraph_also_reads_is_not_fused() -> None:
    model = _conv_bn_model(subgraph_reads_conv=True)
    assert apply_rewrites(model, ["fuse_conv_batchnorm"], RewriteReport()) == 0
    assert [node.op_type for node in model.graph.node] == ["Conv", "BatchNormalization", "Relu", "MatMul", "If"]


def test_a_rewritten_graph_output_keeps_its_name() -> None:
    model = _conv_bn_model()
    model.graph.output.append(helper.make_tensor_value_info("b", TensorProto.FLOAT, [1, 4, 6, 6]))
    x = RNG.normal(size=(1, 3, 6, 6)).astype(np.float32)
    expected = _run(model, x)

    assert apply_rewrites(model, ["fuse_conv_batchnorm"], RewriteReport()) == 1

    assert [value.name for value in model.graph.output] == ["y", "b"]
    for got, want in zip(_run(model, x), expected, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_an_edit_that_fails_leaves_the_model_as_it_was() -> None:
    model = _conv_bn_model()
    before = model.SerializeToString()
    with pytest.raises(RuntimeError), editing(model) as edit:
        edit.graph.remove(list(edit.graph)[2:])
        raise RuntimeError("rule crashed")
    assert model.SerializeToString() == before


def test_editing_a_large_model_copies_no_weights(tmp_path: Path) -> None:
    """A 256 MB weight next to the rewritten nodes: the session's peak stays far below one more copy of it."""
    setup = """
        import numpy as np
        from onnx import TensorProto, helper, numpy_helper
        from qdeploy.graph.rewrites import RewriteReport, apply_rewrites

        big = numpy_helper.from_array(np.ones((8192, 8192), np.float32), "big")
        model = helper.make_model(helper.make_graph(
            [helper.make_node("Reshape", ["x", "s1"], ["a"]), helper.make_node("Reshape", ["a", "s2"], ["b"]),
             helper.make_node("MatMul", ["b", "big"], ["y"])], "g",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8192])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8192])],
            [big, numpy_helper.from_array(np.array([8192, 1], np.int64), "s1"),
             numpy_helper.from_array(np.array([1, 8192], np.int64), "s2")]))
        model.graph.value_info.append(helper.make_tensor_value_info("b", TensorProto.FLOAT, [1, 8192]))
        del big
    """
    measured = """
        assert apply_rewrites(model, ["fuse_reshape_chain"], RewriteReport()) == 1
    """
    assert peak_mib(tmp_path, setup, measured, timeout=120) < 96, "the edit session copied the 256 MB weight"


def test_a_new_weight_of_an_ir3_model_is_also_a_graph_input() -> None:
    """Below IR 4 every initializer must be listed as a graph input: the checker refuses the model otherwise."""
    inits = [numpy_helper.from_array(np.array([1, -1], np.int64), "s1"),
             numpy_helper.from_array(np.array([1, 4, -1], np.int64), "s2")]
    nodes = [helper.make_node("Reshape", ["x", "s1"], ["a"]), helper.make_node("Reshape", ["a", "s2"], ["y"])]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 4, 4]),
              *(helper.make_tensor_value_info(init.name, TensorProto.INT64, list(init.dims)) for init in inits)]
    graph = helper.make_graph(nodes, "g", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 16])],
                              inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 11)])
    model.ir_version = 3
    model = onnx.shape_inference.infer_shapes(model)

    assert apply_rewrites(model, ["fuse_reshape_chain"], RewriteReport()) == 1

    onnx.checker.check_model(model)
    new = {init.name for init in model.graph.initializer} - {"s1", "s2"}
    assert new and new <= {value.name for value in model.graph.input}
