"""qdeploy.graph.names: node names non-empty and unique in a graph and its nested graphs."""

from __future__ import annotations

from pathlib import Path

import onnx
from onnx import TensorProto, helper

from qdeploy.graph.names import NodeNames, name_nodes_uniquely, node_names, unique_node_name


def _graph(names: list[str], body_name: str | None = None) -> onnx.GraphProto:
    """x -> Relu... chain named ``names``; with ``body_name``, an If whose two branches hold a node of that name."""
    nodes = [helper.make_node("Relu", [f"t{i}" if i else "x"], [f"t{i + 1}"], name=name)
             for i, name in enumerate(names)]
    last = f"t{len(names)}"
    if body_name is not None:
        branch = helper.make_graph([helper.make_node("Neg", [last], ["b"], name=body_name)], "branch", [],
                                   [helper.make_tensor_value_info("b", TensorProto.FLOAT, [2])])
        nodes.append(helper.make_node("If", ["c"], ["y"], name="if", then_branch=branch, else_branch=branch))
        last = "y"
    return helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2]),
                                          helper.make_tensor_value_info("c", TensorProto.BOOL, [])],
                             [helper.make_tensor_value_info(last, TensorProto.FLOAT, [2])])


def _all_names(graph: onnx.GraphProto) -> list[str]:
    names = []
    for node in graph.node:
        names.append(node.name)
        for attr in node.attribute:
            if attr.HasField("g"):
                names += _all_names(attr.g)
    return names


def test_nameless_nodes_get_op_and_output_names_and_repeats_get_suffixes() -> None:
    graph = _graph(["", "", "a", "a", "a"])
    naming = name_nodes_uniquely(graph)
    assert [node.name for node in graph.node] == ["Relu_t1", "Relu_t2", "a", "a_2", "a_3"]
    assert (naming.unnamed, naming.duplicates, naming.changed) == (2, 2, 4)
    assert naming.examples[0] == "'' (Relu) -> Relu_t1" and "'a' (Relu) -> a_2" in naming.examples
    assert naming.summary() == {"unnamed_named": 2, "duplicates_renamed": 2, "examples": naming.examples}
    assert name_nodes_uniquely(graph).changed == 0  # a second call changes nothing: the names are stable


def test_a_new_name_never_takes_one_a_later_node_holds() -> None:
    """The nameless first node would be Relu_t1, which the third node is called: it gets Relu_t1_2 instead."""
    graph = _graph(["", "b", "Relu_t1"])
    name_nodes_uniquely(graph)
    assert [node.name for node in graph.node] == ["Relu_t1_2", "b", "Relu_t1"]


def test_names_in_nested_graphs_count() -> None:
    """A branch node called like an outer node is renamed (qdeploy finds nodes by name across the model); the
    two branches of one If are separate graphs that repeat names, as exporters write them."""
    graph = _graph(["n"], body_name="n")
    assert node_names(graph) == {"n", "if"}
    naming = name_nodes_uniquely(graph)
    names = _all_names(graph)
    assert len(names) == len(set(names)) and "" not in names
    assert names[0] == "n" and naming.duplicates == 2  # the then and else branch's node


def test_fresh_names_avoid_every_name_and_each_other() -> None:
    graph = _graph(["MatMul_Q", "", "x_Q"], body_name="inner")
    names = NodeNames.of(graph)
    assert "inner" in names and "" not in names
    assert names.fresh("inner") == "inner_2"
    assert names.derived("", "_Q", "MatMul") == "MatMul_Q_2"  # a nameless node's derived name uses its op type
    assert names.derived("", "_Q", "MatMul") == "MatMul_Q_3"
    assert names.derived("x", "_Q") == "x_Q_2"
    assert names.fresh("", "Cast") == "Cast" and names.fresh("") == "node"
    assert unique_node_name(graph, "x_Q") == "x_Q_2" and unique_node_name(graph, "new") == "new"


def test_naming_reads_no_weights() -> None:
    """A model whose weights are in a data file that is not there is named all the same (nothing reads them)."""
    graph = _graph(["", ""])
    weight = graph.initializer.add()
    weight.name, weight.data_type, weight.data_location = "w", TensorProto.FLOAT, TensorProto.EXTERNAL
    weight.dims.extend([1 << 20, 512])  # 2 GiB, in a file that does not exist
    for key, value in (("location", "missing.data"), ("offset", "0"), ("length", str(2 << 30))):
        entry = weight.external_data.add()
        entry.key, entry.value = key, value
    model = helper.make_model(graph)
    assert name_nodes_uniquely(model).unnamed == 2
    assert [node.name for node in model.graph.node] == ["Relu_t1", "Relu_t2"]


def test_tensors_an_optimizer_named_get_the_suffix_and_the_models_own_names_stay() -> None:
    """ONNX Runtime's optimizer wrote ``gemm_input_shape`` (an initializer) and ``fused`` (a node's output) into a
    model: both end in OPTIMIZER_SUFFIX after, everywhere they are read or declared; the model's own tensors,
    its inputs and outputs and a nested graph's interface keep their names."""
    import numpy as np
    from onnx import numpy_helper

    from qdeploy.graph.names import OPTIMIZER_SUFFIX, rename_optimizer_tensors, tensor_names

    branch = helper.make_graph([helper.make_node("Neg", ["fused"], ["b"], name="neg")], "branch", [],
                               [helper.make_tensor_value_info("b", TensorProto.FLOAT, [2])])
    nodes = [helper.make_node("Reshape", ["x", "gemm_input_shape"], ["fused"], name="reshape"),
             helper.make_node("Relu", ["fused"], ["t"], name="relu"),
             helper.make_node("If", ["c"], ["y"], name="if", then_branch=branch, else_branch=branch)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2]),
                                           helper.make_tensor_value_info("c", TensorProto.BOOL, [])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
                              [numpy_helper.from_array(np.array([2], np.int64), "gemm_input_shape")],
                              value_info=[helper.make_tensor_value_info("fused", TensorProto.FLOAT, [2])])
    before = {"x", "c", "y", "t", "b"}  # what the optimizer was given
    assert rename_optimizer_tensors(graph, before) == 2
    shape, fused = f"gemm_input_shape{OPTIMIZER_SUFFIX}", f"fused{OPTIMIZER_SUFFIX}"
    assert list(graph.node[0].input) == ["x", shape] and list(graph.node[0].output) == [fused]
    assert graph.initializer[0].name == shape and graph.value_info[0].name == fused
    assert list(graph.node[2].attribute[0].g.node[0].input) == [fused]  # read in a nested graph too
    assert tensor_names(graph) == before | {shape, fused}
    onnx.checker.check_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))


def test_tensors_named_as_onnx_runtimes_passes_name_theirs_are_renamed_and_the_model_computes_the_same(
        tmp_path: Path) -> None:
    """A model ONNX Runtime optimized and saved holds gemm_input_shape, gemm_input_shape_token_7...: loading it
    again, its passes generate those names and may fail ("Attempt to replace the existing tensor")."""
    import numpy as np
    import onnxruntime as ort
    from onnx import numpy_helper

    from qdeploy.graph.names import OPTIMIZER_SUFFIX, rename_generated_tensors

    rng = np.random.default_rng(0)
    nodes, weights, x = [], [], "x"
    for index in range(3):  # MatMul + Add on a 3-D input: ORT's MatMulAddFusion writes Reshape -> Gemm -> Reshape
        weights += [numpy_helper.from_array(rng.standard_normal((16, 16)).astype(np.float32), f"w{index}"),
                    numpy_helper.from_array(rng.standard_normal(16).astype(np.float32), f"b{index}")]
        nodes += [helper.make_node("MatMul", [x, f"w{index}"], [f"m{index}"]),
                  helper.make_node("Add", [f"m{index}", f"b{index}"], [f"token_{index}"])]
        x = f"token_{index}"  # a name of the model's own that looks like nothing ORT generates
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 16])],
                              [helper.make_tensor_value_info(x, TensorProto.FLOAT, [1, 8, 16])], weights)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), tmp_path / "m.onnx")
    options = ort.SessionOptions()
    options.optimized_model_filepath = str(tmp_path / "saved.onnx")
    ort.InferenceSession(str(tmp_path / "m.onnx"), options, providers=["CPUExecutionProvider"])
    saved = onnx.load(tmp_path / "saved.onnx")
    generated = {init.name for init in saved.graph.initializer if init.name.startswith("gemm_")}
    assert "gemm_input_shape" in generated and any("_token_" in name for name in generated)
    assert rename_generated_tensors(saved.graph) >= len(generated)
    names = {init.name for init in saved.graph.initializer}
    assert not names & generated and {f"{name}{OPTIMIZER_SUFFIX}" for name in generated} <= names
    assert {"w0", "b2"} <= names and saved.graph.output[0].name == "token_2"  # the model's own names stay
    feed = {"x": rng.standard_normal((1, 8, 16)).astype(np.float32)}
    run = [ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, feed)[0]
           for model in (str(tmp_path / "m.onnx"), saved.SerializeToString())]
    np.testing.assert_allclose(run[1], run[0], rtol=1e-5, atol=1e-5)
