"""Quantization pre-processing: what ORT's quant_pre_process makes, with one copy of the weights at a time."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from qdeploy.stages.quantize.ptq._prepare import prepare
from tests.helpers.peak import peak_mib


def _conv_bn_matmul_add(rng: np.random.Generator) -> onnx.ModelProto:
    """Conv -> BatchNormalization -> Relu -> Flatten -> MatMul -> Add: ORT's basic level fuses the BatchNorm into
    the Conv and the MatMul + Add into a Gemm; symbolic inference names the batch dimension."""
    def f32(*shape: int) -> np.ndarray:
        return rng.standard_normal(shape).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "cw", "cb"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c", "s", "b", "mu", "var"], ["n"]),
             helper.make_node("Relu", ["n"], ["r"]), helper.make_node("Flatten", ["r"], ["f"]),
             helper.make_node("MatMul", ["f", "w"], ["m"]), helper.make_node("Add", ["m", "bias"], ["y"])]
    inits = [numpy_helper.from_array(array, name) for name, array in [
        ("cw", f32(8, 3, 3, 3)), ("cb", f32(8)), ("s", f32(8) ** 2 + 0.5), ("b", f32(8)), ("mu", f32(8)),
        ("var", f32(8) ** 2 + 0.5), ("w", f32(8 * 8 * 8, 10)), ("bias", f32(10))]]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 10])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _shapes(model: onnx.ModelProto) -> dict[str, tuple]:
    found = {}
    for value in [*model.graph.value_info, *model.graph.output]:
        tensor = value.type.tensor_type
        found[value.name] = (tensor.elem_type, tuple(d.dim_value or d.dim_param for d in tensor.shape.dim))
    return found


def test_preparing_makes_what_quant_pre_process_makes(tmp_path: Path) -> None:
    from onnxruntime.quantization.shape_inference import quant_pre_process

    source = tmp_path / "model.onnx"
    onnx.save(_conv_bn_matmul_add(np.random.default_rng(0)), str(source))
    quant_pre_process(str(source), str(tmp_path / "ort.onnx"))
    theirs = onnx.load(str(tmp_path / "ort.onnx"))
    (tmp_path / "work").mkdir()

    prepared = prepare(source, tmp_path / "work")

    ours = onnx.load(str(prepared.path))
    assert Counter(n.op_type for n in ours.graph.node) == Counter(n.op_type for n in theirs.graph.node)
    assert "BatchNormalization" not in prepared.nodes.values() and "Gemm" in prepared.nodes.values()
    assert _shapes(ours) == _shapes(theirs) and len(_shapes(ours)) >= 4
    assert {p.key: p.value for p in ours.metadata_props}["onnx.quant.pre_process"] == "onnxruntime.quant"
    assert prepared.findings.preprocess == "complete"
    assert prepared.original_nodes >= {"", *(n.name for n in onnx.load(str(source)).graph.node)} - {""}
    assert prepared.opset == 17


def test_a_step_that_fails_is_said_and_the_others_still_run(tmp_path: Path) -> None:
    """An op ONNX Runtime does not know: its optimizing session fails; onnx's shape inference still runs."""
    model = _conv_bn_matmul_add(np.random.default_rng(1))
    model.graph.node.append(helper.make_node("Mystery", ["y"], ["z"], domain="com.example"))
    model.graph.output.append(helper.make_tensor_value_info("z", TensorProto.FLOAT, None))
    model.opset_import.append(helper.make_opsetid("com.example", 1))
    source = tmp_path / "model.onnx"
    onnx.save(model, str(source))

    prepared = prepare(source, tmp_path)

    assert prepared.findings.preprocess.startswith("partly: ")
    assert "ONNX Runtime's basic optimizations failed" in prepared.findings.preprocess
    assert "m" in _shapes(onnx.load(str(prepared.path)))  # onnx shape inference ran on the unoptimized model


@pytest.mark.slow  # a large model's memory; the other tests here prepare small models on the fast loop
def test_preparing_a_large_model_holds_one_copy_of_its_weights(tmp_path: Path) -> None:
    """Two 128 MB MatMul weights (256 MB).  Measured above the interpreter's own memory (the libraries it imports
    on the way, sympy included, count): ORT's quant_pre_process 1510 MB, this 760 MB (onnx's loader holds one
    weight twice while it reads it; ORT holds the model while it optimizes it)."""
    dim = 5792  # 5792^2 floats: 128 MB a weight
    weights = [numpy_helper.from_array(np.full((dim, dim), 0.5 + k, np.float32), f"w{k}") for k in range(2)]
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w0"], ["h"]), helper.make_node("Relu", ["h"], ["r"]),
         helper.make_node("MatMul", ["r", "w1"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, dim])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, dim])], weights)
    source = tmp_path / "model.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(source))
    del weights, graph
    (tmp_path / "work").mkdir()
    setup = "from pathlib import Path\nimport onnxruntime\nfrom qdeploy.stages.quantize.ptq._prepare import prepare\n"
    measured = f"""
        prepared = prepare(Path({str(source)!r}), Path({str(tmp_path / "work")!r}))
        assert prepared.findings.preprocess == "complete", prepared.findings
    """
    assert peak_mib(tmp_path, setup, measured) < 1100, "pre-processing held as many copies as quant_pre_process"


def test_a_constant_inside_a_nested_branch_survives_onnx_runtimes_optimizer(tmp_path: Path) -> None:
    """ORT writing its optimized model with external initializers keeps a nested branch's Constant node and adds
    it as an initializer too (a name defined twice: no session loads that); the prepared model must load and
    compute the same."""
    import onnxruntime as ort

    def branch(name: str, nodes: list, out: str) -> onnx.GraphProto:
        return helper.make_graph(nodes, name, [], [helper.make_tensor_value_info(out, TensorProto.FLOAT, [3])])

    one = helper.make_tensor("one", TensorProto.FLOAT, [3], [1.0, 2.0, 3.0])
    inner = helper.make_node("If", ["c2"], ["t"], then_branch=branch("inner_then", [
        helper.make_node("Constant", [], ["one"], value=one), helper.make_node("Add", ["r", "one"], ["a"])], "a"),
        else_branch=branch("inner_else", [helper.make_node("Neg", ["r"], ["n"])], "n"))
    outer = helper.make_node("If", ["c1"], ["y"], then_branch=branch("outer_then", [inner], "t"),
                             else_branch=branch("outer_else", [helper.make_node("Abs", ["r"], ["b"])], "b"))
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["r"]), outer], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3]),
                               helper.make_tensor_value_info("c1", TensorProto.BOOL, []),
                               helper.make_tensor_value_info("c2", TensorProto.BOOL, [])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])])
    source = tmp_path / "model.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), str(source))

    prepared = prepare(source, tmp_path)

    x = np.array([-1.0, 0.5, 2.0], np.float32)
    for c1, c2 in ((True, True), (True, False), (False, True)):
        feed = {"x": x, "c1": np.array(c1), "c2": np.array(c2)}
        expected = ort.InferenceSession(str(source), providers=["CPUExecutionProvider"]).run(None, feed)[0]
        got = ort.InferenceSession(str(prepared.path), providers=["CPUExecutionProvider"]).run(None, feed)[0]
        np.testing.assert_allclose(got, expected)


@pytest.mark.parametrize("mode", ["ptq", "dynamic"])
def test_quantizing_from_the_data_file_builds_the_same_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                            mode: str) -> None:
    """ORT's quantizers read each float weight from the prepared model's data file when they need it: the model
    they build is the one they build from a model holding every weight."""
    from onnxruntime.quantization.quant_utils import add_infer_metadata

    from qdeploy.core.onnx_wire import load_model
    from qdeploy.stages.quantize.ptq import _preprocess, _ptq

    source = tmp_path / "model.onnx"
    onnx.save(_conv_bn_matmul_add(np.random.default_rng(2)), str(source))
    prepared = prepare(source, tmp_path).path
    feeds = [{"x": np.random.default_rng(k).standard_normal((2, 3, 8, 8)).astype(np.float32)} for k in range(3)]
    op_types = _ptq.default_op_types(mode, "int8")

    def build() -> bytes:
        if mode == "dynamic":
            return _ptq.DynamicBuilder(prepared, [], tmp_path, per_channel=True, weight_type="int8",
                                       op_types=op_types)([]).SerializeToString()
        ranges, _ = _ptq.calibrate(prepared, op_types, lambda: iter(feeds), tmp_path, "minmax", 99.99)
        return _ptq.StaticBuilder(prepared, ranges, [], per_channel=True, activation_type="uint8",
                                  weight_type="int8", symmetric_activations=False, symmetric_weights=True,
                                  op_types=op_types)([]).SerializeToString()

    on_demand = build()
    assert len(on_demand) > 4 * 512 * 10 // 4  # the int8 weights are in it

    def whole(path: Path) -> onnx.ModelProto:
        model = load_model(Path(path))
        _preprocess.onnx_shapes(model)
        add_infer_metadata(model)
        return model

    monkeypatch.setattr(_ptq, "load_with_shapes", whole)
    monkeypatch.setattr(_preprocess, "load_with_shapes", whole)
    assert build() == on_demand


def test_a_model_below_opset_7_gets_a_note_where_symbolic_shape_inference_returns_nothing(tmp_path: Path) -> None:
    """ORT's symbolic shape inference returns None (with a warning) below opset 7; pre-processing read its graph
    and failed with "'NoneType' object has no attribute 'graph'"."""
    from qdeploy.stages.quantize.ptq._preprocess import symbolic_shapes

    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 6)])
    assert symbolic_shapes(model, tmp_path) == "symbolic shape inference did not run (it takes standard-ONNX opset 7 " \
                                               "and above)"
