"""The converter's known traps: each small model breaks plain onnxconverter-common; qdeploy's artifact
passes onnx.checker (full), loads in ONNX Runtime and OpenVINO, and agrees with float32."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from qdeploy.core.errors import ModelError
from qdeploy.stages import fp16
from qdeploy.stages.fp16 import Fp16Config
from qdeploy.stages.fp16 import _types as fp16_types
from tests.helpers.fp16 import (
    artifact,
    broken_reason,
    const,
    context,
    make_model,
    plain_convert,
    run_ort,
    run_reference,
    run_stage,
    run_target,
    tensor,
)

BOOL, INT64 = TensorProto.BOOL, TensorProto.INT64


def _assert_plain_breaks(model: onnx.ModelProto, **kwargs: object) -> None:
    try:
        converted = plain_convert(model, **kwargs)
    except Exception:
        return  # the converter itself raised
    assert broken_reason(converted) is not None, "plain onnxconverter-common unexpectedly produced a valid model"


def _assert_sound(tmp_path: Path, original: onnx.ModelProto, converted: onnx.ModelProto,
                  feeds: dict[str, np.ndarray], *, atol: float = 2e-2, reference: bool = True,
                  openvino: bool = True) -> None:
    """Valid, loads in ORT and OpenVINO, and matches float32 (also under float16 arithmetic)."""
    assert broken_reason(converted) is None
    expected = run_ort(original, feeds)
    runs = [run_ort(converted, feeds)]
    if reference:
        runs.append(run_reference(converted, feeds))
    if openvino:
        runs.append(run_target("openvino:cpu", converted, feeds, tmp_path))
    for outputs in runs:
        for got, want in zip(outputs, expected, strict=True):
            np.testing.assert_allclose(np.asarray(got, np.float32), want, rtol=2e-2, atol=atol)


def _x(shape: list[int], low: float = 0.5, high: float = 2.0, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).uniform(low, high, shape).astype(np.float32)


def test_cast_to_float_inside_the_graph_becomes_a_cast_to_float16(tmp_path: Path) -> None:
    nodes = [helper.make_node("Shape", ["x"], ["s"], name="shape"),
             helper.make_node("Cast", ["s"], ["sf"], name="cast", to=TensorProto.FLOAT),
             helper.make_node("ReduceSum", ["sf"], ["n"], name="sum", keepdims=1),
             helper.make_node("Div", ["x", "n"], ["y"], name="div")]
    model = make_model(nodes, [], [tensor("x", [2, 3])], [tensor("y", [2, 3])])
    _assert_plain_breaks(model)
    result = run_stage(tmp_path, model)
    cast = next(node for node in result.model.graph.node if node.name == "cast")
    assert cast.attribute[0].i == TensorProto.FLOAT16
    assert result.findings.repair["type_attributes_rewritten"] == ["cast"]
    _assert_sound(tmp_path, model, result.model, {"x": _x([2, 3])})


@pytest.mark.parametrize("case", ["eyelike", "constant_of_shape", "constant_value_float"])
def test_attributes_that_fix_a_float_output_type_follow_the_node(tmp_path: Path, case: str) -> None:
    make = {
        "eyelike": lambda: helper.make_node("EyeLike", ["x"], ["e"], name="made", dtype=TensorProto.FLOAT),
        "constant_of_shape": lambda: helper.make_node("ConstantOfShape", ["shape"], ["e"], name="made"),
        "constant_value_float": lambda: helper.make_node("Constant", [], ["e"], name="made", value_float=0.25),
    }
    nodes = [helper.make_node("Shape", ["x"], ["shape"], name="shape"), make[case](),
             helper.make_node("Add", ["x", "e"], ["y"], name="add")]
    model = make_model(nodes, [], [tensor("x", [3, 3])], [tensor("y", [3, 3])])
    _assert_plain_breaks(model)
    result = run_stage(tmp_path, model)
    assert result.findings.repair["type_attributes_rewritten"] == ["made"]
    _assert_sound(tmp_path, model, result.model, {"x": _x([3, 3])})


def test_random_normal_like_dtype_follows_the_node(tmp_path: Path) -> None:
    nodes = [helper.make_node("RandomNormalLike", ["x"], ["e"], name="noise", dtype=TensorProto.FLOAT,
                              scale=1e-3, seed=1.0),
             helper.make_node("Add", ["x", "e"], ["y"], name="add")]
    model = make_model(nodes, [], [tensor("x", [3, 3])], [tensor("y", [3, 3])])
    _assert_plain_breaks(model)
    converted = run_stage(tmp_path, model).model
    assert broken_reason(converted) is None
    x = _x([3, 3])
    np.testing.assert_allclose(run_ort(converted, {"x": x})[0], x, atol=2e-2)  # noise of scale 1e-3


def test_resize_scales_stay_float32_when_resize_itself_is_converted(tmp_path: Path) -> None:
    nodes = [helper.make_node("Resize", ["x", "", "scales"], ["y"], name="resize", mode="nearest")]
    model = make_model(nodes, [const("scales", [1, 1, 2, 2])], [tensor("x", [1, 1, 2, 2])], [tensor("y", [1, 1, 4, 4])])
    _assert_plain_breaks(model, op_block_list=[])
    result = run_stage(tmp_path, model, op_block_list=[])
    resize = next(node for node in result.model.graph.node if node.op_type == "Resize")
    inits = {init.name: init.data_type for init in result.model.graph.initializer}
    assert inits[resize.input[2]] == TensorProto.FLOAT
    assert resize.input[0] != "x"  # the data input runs in float16 (after a Cast)
    assert "resize (Resize, opset 17)" in result.findings.schema_float32_inputs[0]
    _assert_sound(tmp_path, model, result.model, {"x": _x([1, 1, 2, 2])})


def test_range_stays_float32_when_not_in_the_block_list(tmp_path: Path) -> None:
    nodes = [helper.make_node("ReduceMax", ["x"], ["limit"], name="rmax", keepdims=0),
             helper.make_node("Range", ["zero", "limit", "one"], ["r"], name="range"),
             helper.make_node("ReduceSum", ["r"], ["y"], name="rsum", keepdims=1)]
    model = make_model(nodes, [const("zero", 0.0), const("one", 1.0)], [tensor("x", [4])], [tensor("y", [1])])
    _assert_plain_breaks(model, op_block_list=[])
    result = run_stage(tmp_path, model, op_block_list=[])
    assert "range" in result.findings.schema_float32_nodes
    x = np.array([1.0, 5.0, 2.0, 3.0], np.float32)
    _assert_sound(tmp_path, model, result.model, {"x": x}, openvino=True)


def _qdq(opset: int) -> onnx.ModelProto:
    nodes = [helper.make_node("QuantizeLinear", ["x", "scale", "zp"], ["q"], name="q"),
             helper.make_node("DequantizeLinear", ["q", "scale", "zp"], ["d"], name="dq"),
             helper.make_node("Mul", ["d", "x"], ["y"], name="mul")]
    return make_model(nodes, [const("scale", 0.05), const("zp", 128, np.uint8)], [tensor("x", [4])],
                      [tensor("y", [4])], opset=opset)


def test_qdq_scales_stay_float32_below_opset_19(tmp_path: Path) -> None:
    model = _qdq(13)
    _assert_plain_breaks(model)
    result = run_stage(tmp_path, model)
    assert "dq" in result.findings.schema_float32_nodes
    assert {i.name: i.data_type for i in result.model.graph.initializer}["scale"] == TensorProto.FLOAT
    # onnx's reference evaluator has no DequantizeLinear-13 implementation
    _assert_sound(tmp_path, model, result.model, {"x": _x([4])}, reference=False)


def test_qdq_at_opset_19_is_converted_with_a_float16_scale(tmp_path: Path) -> None:
    result = run_stage(tmp_path, _qdq(19))
    assert result.findings.schema_float32_nodes == {}
    assert {i.name: i.data_type for i in result.model.graph.initializer}["scale"] == TensorProto.FLOAT16
    # float16 input rounding may move a value across one quantization step (0.05, times x <= 2)
    _assert_sound(tmp_path, _qdq(19), result.model, {"x": _x([4])}, atol=0.1, openvino=False)


def test_initializer_shared_by_float32_and_float16_nodes_gets_a_copy_per_precision(tmp_path: Path) -> None:
    nodes = [helper.make_node("MatMul", ["x", "W"], ["a"], name="mm"),
             helper.make_node("Max", ["a", "W"], ["y"], name="max")]  # Max: in the converter's block list
    model = make_model(nodes, [const("W", np.full((3, 3), 0.7))], [tensor("x", [3, 3])], [tensor("y", [3, 3])])
    _assert_plain_breaks(model)
    result = run_stage(tmp_path, model)
    inits = {init.name: init.data_type for init in result.model.graph.initializer}
    assert inits == {"W": TensorProto.FLOAT, "W__fp16": TensorProto.FLOAT16}
    assert result.findings.repair["initializer_copies"] == {"W__fp16": "W"}
    _assert_sound(tmp_path, model, result.model, {"x": _x([3, 3])})


def _if_reading_outer_names() -> onnx.ModelProto:
    then = helper.make_graph([helper.make_node("Mul", ["x", "c2"], ["t"], name="then_mul")], "then", [],
                             [tensor("t", [2])])
    other = helper.make_graph([helper.make_node("Add", ["x", "c2"], ["e"], name="else_add")], "else", [],
                              [tensor("e", [2])])
    nodes = [helper.make_node("If", ["cond"], ["y"], name="if", then_branch=then, else_branch=other)]
    return make_model(nodes, [const("c2", [3.0, 3.0])], [tensor("x", [2]), tensor("cond", [], BOOL)],
                      [tensor("y", [2])])


def test_if_branches_reading_a_graph_input_get_a_cast_in_the_main_graph(tmp_path: Path) -> None:
    model = _if_reading_outer_names()
    _assert_plain_breaks(model)
    result = run_stage(tmp_path, model)
    main_casts = [node.input[0] for node in result.model.graph.node if node.op_type == "Cast"]
    assert main_casts.count("x") == 1 and len(main_casts) == 2  # x to float16, the If's output to float32
    branch_ops = [node.op_type for attr in result.model.graph.node[-1].attribute for node in attr.g.node]
    assert "Cast" not in branch_ops  # the casts live in the graph that owns the tensor
    for cond in (True, False):
        _assert_sound(tmp_path, model, result.model, {"x": _x([2]), "cond": np.array(cond)}, atol=1e-2)


def _loop_with_outer_references() -> onnx.ModelProto:
    body = helper.make_graph(
        [helper.make_node("Mul", ["v_in", "w"], ["a"], name="body_mul"),
         helper.make_node("Add", ["a", "bx"], ["v_out"], name="body_add"),
         helper.make_node("Identity", ["cond_in"], ["cond_out"], name="body_cond")],
        "body", [tensor("i", [], INT64), tensor("cond_in", [], BOOL), tensor("v_in", [2])],
        [tensor("cond_out", [], BOOL), tensor("v_out", [2])])
    nodes = [helper.make_node("Relu", ["x"], ["bx"], name="relu"),
             helper.make_node("Loop", ["trip", "", "x"], ["v"], name="loop", body=body),
             helper.make_node("Mul", ["v", "w"], ["y"], name="mul")]
    return make_model(nodes, [const("trip", 3, np.int64), const("w", [0.5, 2.0])], [tensor("x", [2])],
                      [tensor("y", [2])])


@pytest.mark.parametrize("blocked", ["body_mul", "loop"])
def test_loop_body_with_a_float32_node_reads_outer_tensors_in_the_right_precision(tmp_path: Path,
                                                                                  blocked: str) -> None:
    model = _loop_with_outer_references()
    _assert_plain_breaks(model, node_block_list=[blocked])
    result = run_stage(tmp_path, model, node_block_list=[blocked])
    assert result.findings.repair["initializer_copies"] == {"w__fp32": "w"}
    # onnx's reference evaluator runs this Loop zero times, even on the float32 model: not used here
    _assert_sound(tmp_path, model, result.model, {"x": np.array([1.5, -2.0], np.float32)}, reference=False)


def test_unnamed_nodes_one_cast_per_tensor_and_no_redundant_cast_pairs(tmp_path: Path) -> None:
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Sigmoid", ["x"], ["s"]),
             helper.make_node("Max", ["r", "s"], ["m"]),           # float32 (converter's block list)
             helper.make_node("Min", ["m", "c"], ["a"]),           # float32, reads Max directly
             helper.make_node("Min", ["m", "c2"], ["b"]),          # float32, reads Max directly
             helper.make_node("TopK", ["a", "k"], ["top", "index"]),
             helper.make_node("Add", ["top", "b"], ["y"])]
    model = make_model(nodes, [const("c", 0.9), const("c2", 0.6), const("k", [4], np.int64)],
                       [tensor("x", [4])], [tensor("y", [4])])
    _assert_plain_breaks(model)  # Casts named after nameless nodes collide: 'x_cast_to_' made twice
    named = make_model([helper.make_node(n.op_type, n.input, n.output, name=f"n{i}") for i, n in enumerate(nodes)],
                       list(model.graph.initializer), list(model.graph.input), list(model.graph.output))
    plain = plain_convert(named)
    assert sum(node.op_type == "Cast" and node.input[0] == "x" for node in plain.graph.node) == 2  # one per reader
    plain_producers = {out: node for node in plain.graph.node for out in node.output}
    assert all(plain_producers[node.input[0]].op_type == "Cast" for node in plain.graph.node if node.op_type == "Min")
    result = run_stage(tmp_path, model).model
    names = [node.name for node in result.graph.node]
    assert all(names) and len(set(names)) == len(names)
    assert sum(node.op_type == "Cast" and node.input[0] == "x" for node in result.graph.node) == 1
    producers = {out: node for node in result.graph.node for out in node.output}
    for node in result.graph.node:
        if node.op_type == "Min":  # no float32 -> float16 -> float32 pair between Max and the Mins
            assert producers[node.input[0]].op_type == "Max"
    _assert_sound(tmp_path, model, result, {"x": _x([4], -2, 2)})


def test_a_graph_output_that_another_node_reads(tmp_path: Path) -> None:
    nodes = [helper.make_node("Relu", ["x"], ["y"], name="relu"), helper.make_node("Sigmoid", ["y"], ["z"], name="sig")]
    model = make_model(nodes, [], [tensor("x", [4])], [tensor("y", [4]), tensor("z", [4])])
    _assert_plain_breaks(model)  # the reader of y gets the float32 copy made for the graph output
    result = run_stage(tmp_path, model)
    sigmoid = next(node for node in result.model.graph.node if node.name == "sig")
    producers = {out: node for node in result.model.graph.node for out in node.output}
    assert producers[sigmoid.input[0]].name == "relu"  # reads the float16 value, not a Cast of the output
    _assert_sound(tmp_path, model, result.model, {"x": _x([4], -2, 2)})


def test_contrib_op_outputs_are_typed_by_onnxruntime(tmp_path: Path) -> None:
    nodes = [helper.make_node("Gelu", ["x"], ["g"], name="gelu", domain="com.microsoft"),
             helper.make_node("Max", ["g", "c"], ["y"], name="max")]
    model = make_model(nodes, [const("c", 0.1)], [tensor("x", [4])], [tensor("y", [4])],
                       extra_opsets=(("com.microsoft", 1),))
    _assert_plain_breaks(model)
    result = run_stage(tmp_path, model)
    _assert_sound(tmp_path, model, result.model, {"x": _x([4], -2, 2)}, reference=False, openvino=False)


def test_a_tensor_nobody_can_type_is_an_error_naming_it(tmp_path: Path) -> None:
    nodes = [helper.make_node("Mystery", ["x"], ["g"], name="mystery", domain="my.ops"),
             helper.make_node("Max", ["g", "c"], ["y"], name="max")]
    model = make_model(nodes, [const("c", 0.1)], [tensor("x", [4])], [tensor("y", [4])],
                       extra_opsets=(("my.ops", 1),))
    with pytest.raises(ModelError, match=r"'g' \(output of node 'mystery' \(my.ops.Mystery\)"):
        run_stage(tmp_path, model)


def test_large_models_are_typed_through_a_file_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = make_model([helper.make_node("MatMul", ["x", "W"], ["a"], name="mm"),
                        helper.make_node("Relu", ["a"], ["y"], name="relu")],
                       [const("W", np.random.default_rng(0).standard_normal((64, 64)))],
                       [tensor("x", [1, 64])], [tensor("y", [1, 64])])
    path = tmp_path / "big.onnx"
    onnx.save(copy.deepcopy(model), str(path), save_as_external_data=True, location="big.data", size_threshold=0)
    seen = []
    real = onnx.shape_inference.infer_shapes_path

    def spy(source: str, target: str = "", **kwargs: object) -> None:
        seen.append(source)
        real(source, target, **kwargs)

    monkeypatch.setattr(fp16_types, "INFERENCE_BY_PATH_BYTES", 1)
    monkeypatch.setattr(onnx.shape_inference, "infer_shapes_path", spy)
    big = artifact(tmp_path, onnx.load(str(path)), "copy.onnx")  # only for its fields
    big = type(big)(path=path, sidecar=big.sidecar, key="k", sha256="s", size_bytes=3 * 2**30,
                    stages=("export",), parent=None)
    result = fp16.run(big, Fp16Config(), context(tmp_path))
    assert seen == [str(path)]
    assert {i.name: i.data_type for i in result.model.graph.initializer} == {"W": TensorProto.FLOAT16}
    _assert_sound(tmp_path, model, result.model, {"x": _x([1, 64], -1, 1)}, atol=5e-2)


@pytest.mark.parametrize("keep_io_types", [True, False])
def test_an_output_that_folding_made_a_constant_converts(tmp_path: Path, keep_io_types: bool) -> None:
    """simplify folds Constant -> Mul -> output into an initializer that is itself a graph output: no node for the
    converter to cast after, so it turned the tensor float16 under a float32 output and onnx.checker refused the
    model ("Inferred elem type differs ... (10) vs (1)"); frozen inputs make such outputs common."""
    values = np.array([1.5, -2.25, 3.0], np.float32)
    model = make_model([helper.make_node("Relu", ["x"], ["y"], name="relu")], [const("c", values)],
                       [tensor("x", [1, 4])], [tensor("y", [1, 4]), tensor("c", [3])])
    model.ir_version = 10  # as simplify writes it (the checker let IR 8 through)
    result = run_stage(tmp_path, model, keep_io_types=keep_io_types)
    declared = {out.name: out.type.tensor_type.elem_type for out in result.model.graph.output}
    expected = TensorProto.FLOAT if keep_io_types else TensorProto.FLOAT16
    assert declared == {"y": expected, "c": expected}
    x = np.array([[-1.0, 0.5, 2.0, -3.0]], np.float32)
    y, c = run_ort(result.model, {"x": x.astype(np.float32 if keep_io_types else np.float16)})
    np.testing.assert_array_equal(c, values.astype(c.dtype))
    np.testing.assert_array_equal(y, np.maximum(x, 0).astype(y.dtype))
