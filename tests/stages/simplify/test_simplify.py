"""The simplify stage on tiny inline models: graph shape (op types) and numerical agreement."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from pydantic import ValidationError

from qdeploy.core.context import Artifact, StageContext
from qdeploy.core.errors import StageError
from qdeploy.stages import simplify
from qdeploy.stages.simplify import SimplifyConfig, run
from qdeploy.stages.simplify import _folding as folding
from qdeploy.stages.simplify import _shapes as simplify_shapes
from qdeploy.stages.simplify._check import compare_simplified
from tests.helpers.models import tiny_cnn
from tests.helpers.simplify import simplify_model

RNG = np.random.default_rng(0)


def _rand(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def _init(name: str, array: np.ndarray) -> onnx.TensorProto:
    return numpy_helper.from_array(array, name)


def _model(nodes: list[onnx.NodeProto], inputs: list[onnx.ValueInfoProto], outputs: list[onnx.ValueInfoProto],
           inits: list[onnx.TensorProto] = (), opset: int = 17, ir_version: int = 8) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = ir_version
    return model


def _vi(name: str, shape: list[int] | None, elem: int = TensorProto.FLOAT) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, shape)




def _ops(model: onnx.ModelProto) -> list[str]:
    return [node.op_type for node in model.graph.node]


def _infer(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def _assert_same(original: onnx.ModelProto, simplified: onnx.ModelProto, feeds: dict[str, np.ndarray],
                 atol: float = 1e-6, rtol: float = 1e-5) -> None:
    for want, got in zip(_infer(original, feeds), _infer(simplified, feeds), strict=True):
        np.testing.assert_allclose(got, want, atol=atol, rtol=rtol)


def _conv_bn() -> onnx.ModelProto:
    inits = [_init("w", _rand(4, 3, 3, 3)), _init("b", _rand(4)), _init("scale", _rand(4) + 2.0),
             _init("bias", _rand(4)), _init("mean", _rand(4)), _init("var", np.abs(_rand(4)) + 0.5)]
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c", "scale", "bias", "mean", "var"], ["y"])]
    return _model(nodes, [_vi("x", [1, 3, 8, 8])], [_vi("y", [1, 4, 8, 8])], inits)


def test_conv_batchnorm_fuses_into_one_conv(tmp_path: Path, ctx: StageContext) -> None:
    model = _conv_bn()
    result = simplify_model(model, tmp_path, ctx)
    assert _ops(result.model) == ["Conv"]
    assert [out.name for out in result.model.graph.output] == ["y"]
    assert result.changed
    assert result.findings.nodes_before == {"BatchNormalization": 1, "Conv": 1}
    assert result.findings.nodes_after == {"Conv": 1}
    assert result.findings.node_count_after == 1
    assert result.findings.check.samples == 3
    assert result.findings.check.max_abs_err < 1e-4
    _assert_same(model, result.model, {"x": _rand(1, 3, 8, 8)}, atol=1e-5, rtol=1e-5)


def test_skip_fuse_bn_and_skipped_passes_are_honoured(tmp_path: Path, ctx: StageContext) -> None:
    model = _conv_bn()
    model.graph.node.append(helper.make_node("Identity", ["y"], ["out"]))
    model.graph.output[0].name = "out"
    result = simplify_model(model, tmp_path, ctx, skip_fuse_bn=True, skipped_passes=["eliminate_identity"])
    assert _ops(result.model) == ["Conv", "BatchNormalization", "Identity"]
    assert "fuse_bn_into_conv" not in result.findings.passes
    assert "eliminate_identity" not in result.findings.passes
    assert not result.changed
    fused = simplify_model(model, tmp_path, ctx)
    assert _ops(fused.model) == ["Conv"]
    not_folded = simplify_model(model, tmp_path, ctx, fold_constants=False)
    assert _ops(not_folded.model) == ["Conv", "BatchNormalization"]


def test_tiny_cnn_simplifies_and_agrees(tmp_path: Path, ctx: StageContext) -> None:
    model = tiny_cnn()
    result = simplify_model(model, tmp_path, ctx)
    assert "BatchNormalization" not in _ops(result.model)
    assert result.findings.node_count_after == result.findings.node_count_before - 1
    _assert_same(model, result.model, {"input": _rand(1, 3, 16, 16)}, atol=1e-5, rtol=1e-4)


def test_shape_chain_on_a_static_input_folds_away(tmp_path: Path, ctx: StageContext) -> None:
    model = onnx.parser.parse_model("""
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[2,3,4] x) => (float[2,12] y) {
            s = Shape(x)
            zero = Constant<value = int64 {0}>()
            d0 = Gather<axis = 0>(s, zero)
            axes = Constant<value = int64[1] {0}>()
            d0u = Unsqueeze(d0, axes)
            minus1 = Constant<value = int64[1] {-1}>()
            target = Concat<axis = 0>(d0u, minus1)
            y = Reshape(x, target)
        }""")
    result = simplify_model(model, tmp_path, ctx)
    assert _ops(result.model) == ["Reshape"]
    shape_input = result.model.graph.node[0].input[1]
    target = {init.name: numpy_helper.to_array(init) for init in result.model.graph.initializer}[shape_input]
    np.testing.assert_array_equal(target, [2, -1])
    assert result.findings.folded_tensors >= 1
    _assert_same(model, result.model, {"x": _rand(2, 3, 4)}, atol=0, rtol=0)


def test_shape_of_a_dynamic_input_is_not_folded(tmp_path: Path, ctx: StageContext) -> None:
    model = onnx.parser.parse_model("""
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[N,4] x) => (int64[2] y) {
            y = Shape(x)
        }""")
    result = simplify_model(model, tmp_path, ctx)
    assert _ops(result.model) == ["Shape"]


def test_constant_node_weights_become_initializers(tmp_path: Path, ctx: StageContext) -> None:
    weight = helper.make_tensor("w_value", TensorProto.FLOAT, [4, 5], _rand(4, 5).ravel())
    nodes = [helper.make_node("Constant", [], ["w"], value=weight),
             helper.make_node("Constant", [], ["b"], value_floats=list(_rand(5))),
             helper.make_node("MatMul", ["x", "w"], ["m"]),
             helper.make_node("Add", ["m", "b"], ["y"])]
    model = _model(nodes, [_vi("x", [2, 4])], [_vi("y", [2, 5])])
    result = simplify_model(model, tmp_path, ctx)
    assert "Constant" not in _ops(result.model)
    assert _ops(result.model) == ["Gemm"]  # 2-D MatMul + Add
    assert {"w", "b"} <= {init.name for init in result.model.graph.initializer}
    assert result.findings.constants_converted == 2
    _assert_same(model, result.model, {"x": _rand(2, 4)})


def test_matmul_add_on_3d_input_is_not_turned_into_gemm(tmp_path: Path, ctx: StageContext) -> None:
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Add", ["m", "b"], ["y"])]
    model = _model(nodes, [_vi("x", [2, 3, 4])], [_vi("y", [2, 3, 5])], [_init("w", _rand(4, 5)), _init("b", _rand(5))])
    result = simplify_model(model, tmp_path, ctx)
    assert _ops(result.model) == ["MatMul", "Add"]


def _constant_of_shape_model(side: int) -> onnx.ModelProto:
    nodes = [helper.make_node("ConstantOfShape", ["shape"], ["big"],
                              value=helper.make_tensor("v", TensorProto.FLOAT, [1], [1.5])),
             helper.make_node("Add", ["x", "big"], ["y"])]
    return _model(nodes, [_vi("x", [side, side])], [_vi("y", [side, side])],
                  [_init("shape", np.array([side, side], dtype=np.int64))])


@pytest.mark.parametrize(("limit_mb", "folded"), [(0.1, False), (16, True)])
def test_fold_size_limit_keeps_large_constant_of_shape(tmp_path: Path, ctx: StageContext, limit_mb: float,
                                                       folded: bool) -> None:
    model = _constant_of_shape_model(256)  # 256*256 float32 = 256 KiB
    result = simplify_model(model, tmp_path, ctx, fold_size_limit_mb=limit_mb)
    assert ("ConstantOfShape" not in _ops(result.model)) == folded
    skipped = result.findings.fold_skipped
    if folded:
        assert skipped == []
    else:
        assert [(entry.tensor, entry.bytes) for entry in skipped] == [("big", 256 * 256 * 4)]
        assert "inferred shape" in skipped[0].reason  # refused before evaluation, nothing was allocated
        assert all(init.name != "big" for init in result.model.graph.initializer)
    _assert_same(model, result.model, {"x": _rand(256, 256)})


def test_size_limit_applies_after_evaluation_when_shapes_are_unknown() -> None:
    model = _constant_of_shape_model(64)  # 16 KiB; no shape inference ran, so no estimate
    report = folding.fold_constants(model, limit_bytes=4096)
    assert _ops(model) == ["ConstantOfShape", "Add"]
    assert report.skipped == [{"tensor": "big", "bytes": 64 * 64 * 4,
                               "reason": "folded tensor above the limit of 4096 bytes"}]
    report = folding.fold_constants(model, limit_bytes=1 << 20)
    assert _ops(model) == ["Add"] and report.folded_tensors == 1


def test_dequantize_linear_of_an_int8_weight_is_kept(tmp_path: Path, ctx: StageContext) -> None:
    inits = [_init("wq", RNG.integers(-127, 128, (4, 5)).astype(np.int8)),
             _init("scale", np.array(0.02, dtype=np.float32)), _init("zp", np.array(0, dtype=np.int8)),
             _init("w2f", _rand(5, 3))]
    nodes = [helper.make_node("DequantizeLinear", ["wq", "scale", "zp"], ["w"]),
             helper.make_node("MatMul", ["x", "w"], ["h"]),
             helper.make_node("QuantizeLinear", ["w2f", "scale", "zp"], ["w2q"]),  # a float weight, Q then DQ
             helper.make_node("DequantizeLinear", ["w2q", "scale", "zp"], ["w2"]),
             helper.make_node("MatMul", ["h", "w2"], ["y"])]
    model = _model(nodes, [_vi("x", [2, 4])], [_vi("y", [2, 3])], inits)
    result = simplify_model(model, tmp_path, ctx)
    assert _ops(result.model) == ["DequantizeLinear", "MatMul", "QuantizeLinear", "DequantizeLinear", "MatMul"]
    types = {init.name: init.data_type for init in result.model.graph.initializer}
    assert types["wq"] == TensorProto.INT8 and "w" not in types
    assert result.findings.folded_tensors == 0


def _if_model() -> onnx.ModelProto:
    then = helper.make_graph([helper.make_node("Add", ["x", "w2"], ["t"])], "then", [], [_vi("t", [2])])
    other = helper.make_graph([helper.make_node("Sub", ["x", "w2"], ["e"])], "else", [], [_vi("e", [2])])
    nodes = [helper.make_node("Add", ["w", "w"], ["w2"]),  # foldable, read only inside the branches
             helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other)]
    return _model(nodes, [_vi("x", [2]), _vi("c", [], TensorProto.BOOL)], [_vi("y", [2])],
                  [_init("w", np.array([1.0, 2.0], dtype=np.float32))])


def test_if_model_survives_and_computes_the_same(tmp_path: Path, ctx: StageContext) -> None:
    model = _if_model()
    result = simplify_model(model, tmp_path, ctx)
    assert _ops(result.model) == ["If"]
    assert "w2" in {init.name for init in result.model.graph.initializer}
    assert any("subgraphs (in If nodes)" in note for note in result.findings.notes)
    for cond in (True, False):
        _assert_same(model, result.model, {"x": _rand(2), "c": np.array(cond)}, atol=0, rtol=0)


def test_output_names_are_preserved(tmp_path: Path, ctx: StageContext) -> None:
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Identity", ["r"], ["y"]),
             helper.make_node("Identity", ["y"], ["z"]), helper.make_node("Add", ["k0", "k0"], ["k"])]
    model = _model(nodes, [_vi("x", [3])], [_vi("y", [3]), _vi("z", [3]), _vi("k", [3])],
                   [_init("k0", np.arange(3, dtype=np.float32))])
    result = simplify_model(model, tmp_path, ctx)
    assert [out.name for out in result.model.graph.output] == ["y", "z", "k"]
    assert list(result.model.graph.output) == list(model.graph.output)  # types and shapes too
    assert "Add" not in _ops(result.model) and "k" in {init.name for init in result.model.graph.initializer}
    _assert_same(model, result.model, {"x": _rand(3)}, atol=0, rtol=0)


@pytest.mark.parametrize(("ir_version", "foldable"), [(8, False), (3, True)])
def test_initializer_listed_as_input_is_overridable_from_ir4(tmp_path: Path, ctx: StageContext, ir_version: int,
                                                             foldable: bool) -> None:
    nodes = [helper.make_node("Mul", ["w", "w"], ["w2"]), helper.make_node("Add", ["x", "w2"], ["y"]),
             helper.make_node("Shape", ["w"], ["s"])]
    model = _model(nodes, [_vi("x", [2]), _vi("w", [None])], [_vi("y", [2]), _vi("s", [1], TensorProto.INT64)],
                   [_init("w", np.array([1.0, 2.0], dtype=np.float32))], opset=13, ir_version=ir_version)
    result = simplify_model(model, tmp_path, ctx)
    assert ("Mul" not in _ops(result.model)) == foldable
    assert ("Shape" not in _ops(result.model)) == foldable  # an override may have another length
    if not foldable:  # the default can still be overridden
        feeds = {"x": np.zeros(2, np.float32), "w": np.array([3.0, 4.0], dtype=np.float32)}
        np.testing.assert_array_equal(_infer(result.model, feeds)[0], [9.0, 16.0])


def test_random_ops_are_not_folded(tmp_path: Path, ctx: StageContext) -> None:
    nodes = [helper.make_node("RandomUniform", [], ["r"], shape=[3], seed=1.0),
             helper.make_node("Add", ["x", "r"], ["y"])]
    model = _model(nodes, [_vi("x", [3])], [_vi("y", [3])])
    result = simplify_model(model, tmp_path, ctx, check_n=0)
    assert _ops(result.model) == ["RandomUniform", "Add"]
    assert result.findings.check.unchecked == "check_n is 0"


def test_already_simple_model_is_unchanged(tmp_path: Path, ctx: StageContext) -> None:
    model = _model([helper.make_node("Relu", ["x"], ["y"])], [_vi("x", [3])], [_vi("y", [3])])
    result = simplify_model(model, tmp_path, ctx)
    assert not result.changed
    assert result.findings.iterations == 1
    assert result.findings.folded_tensors == 0


def test_custom_op_model_skips_the_check_with_a_finding(tmp_path: Path, ctx: StageContext) -> None:
    nodes = [helper.make_node("Add", ["k0", "k0"], ["k"]), helper.make_node("Mystery", ["x", "k"], ["y"],
                                                                             domain="acme")]
    model = _model(nodes, [_vi("x", [3])], [_vi("y", [3])], [_init("k0", np.ones(3, np.float32))])
    model.opset_import.append(helper.make_opsetid("acme", 1))
    path = tmp_path / "model.onnx"
    onnx.save(model, path)
    artifact = Artifact(path=path, sidecar=tmp_path / "x.json", key="k", sha256="", size_bytes=0, stages=(),
                        parent=None)
    result = run(artifact, SimplifyConfig(), ctx)
    assert _ops(result.model) == ["Mystery"]
    assert "does not load in ONNX Runtime" in result.findings.check.unchecked


def test_equivalence_check_catches_a_wrong_fold(tmp_path: Path, ctx: StageContext,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    real_run = folding._run_ort

    def corrupted(model: onnx.ModelProto) -> dict[str, np.ndarray]:
        return {name: value + np.float32(0.5) for name, value in real_run(model).items()}

    monkeypatch.setattr(folding, "_run_ort", corrupted)
    nodes = [helper.make_node("Mul", ["a", "b"], ["ab"]), helper.make_node("Add", ["x", "ab"], ["y"])]
    model = _model(nodes, [_vi("x", [4])], [_vi("y", [4])], [_init("a", _rand(4)), _init("b", _rand(4))])
    with pytest.raises(StageError, match=r"output 'y': max abs error 0\.5") as caught:
        simplify_model(model, tmp_path, ctx)
    assert caught.value.stage == "simplify" and caught.value.variant == "v"


@pytest.mark.parametrize("field", ["skipped_passes", "extra_passes"])
def test_unknown_pass_name_fails_validation(field: str) -> None:
    with pytest.raises(ValidationError, match="fuse_everything") as caught:
        SimplifyConfig(**{field: ["fuse_everything"]})
    assert "fuse_bn_into_conv" in str(caught.value)  # the known names are listed


def test_contradictory_pass_settings_fail_validation() -> None:
    with pytest.raises(ValidationError, match="both"):
        SimplifyConfig(skipped_passes=["eliminate_identity"], extra_passes=["eliminate_identity"])
    with pytest.raises(ValidationError, match="skip_fuse_bn"):
        SimplifyConfig(skip_fuse_bn=True, extra_passes=["fuse_bn_into_conv"])
    with pytest.raises(ValidationError, match="inputs or outputs"):
        SimplifyConfig(extra_passes=["rename_input_output"])
    with pytest.raises(ValidationError, match="extra"):
        SimplifyConfig(unknown_field=1)


def test_compare_simplified_tolerances() -> None:
    ref = {"f": np.array([1.0, np.nan, np.inf], np.float32), "i": np.array([1, 2], np.int64)}
    assert compare_simplified(ref, {"f": ref["f"] + 1e-6, "i": ref["i"]}, atol=1e-5, rtol=0).passed
    bad_float = compare_simplified(ref, {"f": ref["f"] + 1e-3, "i": ref["i"]}, atol=1e-5, rtol=0)
    assert not bad_float.passed and "output 'f'" in bad_float.reason
    nan_moved = compare_simplified(ref, {"f": np.array([np.nan, 1.0, np.inf], np.float32), "i": ref["i"]},
                                   atol=1e-5, rtol=0)
    assert not nan_moved.passed
    assert not compare_simplified(ref, {"f": ref["f"], "i": ref["i"] + 1}, atol=1.0, rtol=1.0).passed
    assert not compare_simplified(ref, {"f": ref["f"][:2], "i": ref["i"]}, atol=1.0, rtol=1.0).passed
    assert not compare_simplified(ref, {"f": ref["f"]}, atol=1.0, rtol=1.0).passed


def _sqrt_model() -> onnx.ModelProto:
    nodes = [helper.make_node("Mul", ["a", "a"], ["aa"]), helper.make_node("Sqrt", ["aa"], ["r"]),
             helper.make_node("Add", ["x", "r"], ["y"])]
    return _model(nodes, [_vi("x", [3])], [_vi("y", [3])], [_init("a", np.array([1.0, -2.0, 3.0], np.float32))])


@pytest.mark.parametrize("reference_works", [True, False])
def test_ops_onnxruntime_refuses_fall_back_to_onnx_reference(tmp_path: Path, ctx: StageContext,
                                                            monkeypatch: pytest.MonkeyPatch,
                                                            reference_works: bool) -> None:
    real_ort, real_reference = folding._run_ort, folding._run_reference

    def ort_without_sqrt(model: onnx.ModelProto) -> dict[str, np.ndarray]:
        if "Sqrt" in _ops(model):
            raise RuntimeError("no kernel for Sqrt")
        return real_ort(model)

    def reference(model: onnx.ModelProto) -> dict[str, np.ndarray]:
        if not reference_works:
            raise RuntimeError("reference refuses too")
        return real_reference(model)

    monkeypatch.setattr(folding, "_run_ort", ort_without_sqrt)
    monkeypatch.setattr(folding, "_run_reference", reference)
    model = _sqrt_model()
    result = simplify_model(model, tmp_path, ctx)
    if reference_works:
        assert _ops(result.model) == ["Add"] and result.findings.fold_failed_ops == []
        values = {init.name: numpy_helper.to_array(init) for init in result.model.graph.initializer}
        np.testing.assert_array_equal(values["r"], [1.0, 2.0, 3.0])
    else:
        assert _ops(result.model) == ["Sqrt", "Add"] and result.findings.fold_failed_ops == ["Sqrt"]
    _assert_same(model, result.model, {"x": _rand(3)}, atol=0, rtol=0)


def test_float8_values_keep_their_type(tmp_path: Path, ctx: StageContext) -> None:
    nodes = [helper.make_node("Cast", ["a"], ["y8"], to=TensorProto.FLOAT8E4M3FN),
             helper.make_node("Relu", ["x"], ["y"])]
    model = _model(nodes, [_vi("x", [2])], [_vi("y", [2]), _vi("y8", [2], TensorProto.FLOAT8E4M3FN)],
                   [_init("a", np.array([1.5, 4.0], np.float32))], opset=21, ir_version=10)
    result = simplify_model(model, tmp_path, ctx)
    types = {init.name: init.data_type for init in result.model.graph.initializer}
    assert types.get("y8", TensorProto.FLOAT8E4M3FN) == TensorProto.FLOAT8E4M3FN
    _assert_same(model, result.model, {"x": _rand(2)}, atol=0, rtol=0)


def test_large_models_infer_shapes_through_a_file(tmp_path: Path, ctx: StageContext,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(simplify_shapes, "INFER_BY_PATH_BYTES", 0)
    model = _conv_bn()
    model.graph.node.extend([helper.make_node("Shape", ["y"], ["s"]), helper.make_node("Reshape", ["y", "s"], ["z"])])
    model.graph.output[0].name = "z"
    result = simplify_model(model, tmp_path, ctx)
    assert _ops(result.model) == ["Conv"] or _ops(result.model) == ["Conv", "Reshape"]
    assert "Shape" not in _ops(result.model) and result.findings.notes == []
    assert list(ctx.work_dir.iterdir()) == []  # the temporary files are gone
    _assert_same(model, result.model, {"x": _rand(1, 3, 8, 8)}, atol=1e-5, rtol=1e-5)


def test_models_above_the_protobuf_limit_fold_in_pieces_and_are_checked_from_a_file(
        tmp_path: Path, ctx: StageContext, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(simplify, "CHECK_FROM_FILE_BYTES", 0)  # every model counts as a large one
    monkeypatch.setattr(folding, "MAX_EVAL_BYTES", 400)  # the conv weight (432 bytes) is too large to evaluate
    model = _conv_bn()
    model.graph.node.extend([helper.make_node("Constant", [], ["k"], value_float=2.0),
                             helper.make_node("Mul", ["k", "k"], ["kk"]), helper.make_node("Mul", ["y", "kk"], ["z"]),
                             helper.make_node("Transpose", ["w"], ["wt"]), helper.make_node("Relu", ["wt"], ["z2"])])
    model.graph.output[0].name = "z"
    model.graph.output.append(_vi("z2", [3, 3, 3, 4]))
    references: list[tuple[Path, bool]] = []
    check = simplify.check_equivalence

    def spy(reference: Path, *args: Any, **kwargs: Any) -> dict[str, Any]:
        references.append((reference, reference.with_name(reference.name + ".data").is_file()))
        return check(reference, *args, **kwargs)

    monkeypatch.setattr(simplify, "check_equivalence", spy)
    result = simplify_model(model, tmp_path, ctx, skip_fuse_bn=True)
    # the one-file original was checked from a copy whose weights ONNX Runtime maps from a data file
    assert references == [(ctx.work_dir / "original.onnx", True)]
    assert not (ctx.work_dir / "original.onnx").exists()  # and that copy is gone
    assert _ops(result.model) == ["Conv", "BatchNormalization", "Mul", "Transpose", "Relu"]  # k*k folded
    assert result.findings.fold_failed_ops == ["Transpose"]
    assert result.findings.unchecked() is None and result.findings.check.samples > 0
    assert result.path is not None and result.path.is_file()  # what ONNX Runtime checked, stored as it is
    _assert_same(model, onnx.load(str(result.path)), {"x": _rand(1, 3, 8, 8)}, atol=1e-5, rtol=1e-5)
