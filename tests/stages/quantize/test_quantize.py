"""The quantize stage: QDQ around convolutions, int8 kernels in ORT, refusals, dynamic mode, exclusions."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from pydantic import ValidationError

from qdeploy.core.errors import StageError
from qdeploy.stages import quantize
from qdeploy.stages.quantize import CalibrationRef, QuantizeConfig
from qdeploy.stages.quantize.ptq._verify import int8_kernels
from tests.helpers.quantize import (
    DEMO_MODEL,
    DEMO_VAL,
    artifact_at,
    cosine,
    init,
    make_model,
    producers,
    run_ort,
    save_artifact,
    stage_context,
    tiny_conv,
)


def calib_folder(tmp_path: Path, count: int = 12, name: str = "calib") -> Path:
    folder = tmp_path / name
    folder.mkdir()
    rng = np.random.default_rng(3)
    for index in range(count):
        smooth = np.cumsum(rng.standard_normal((3, 16, 16)), axis=2) / 4  # image-like: correlated neighbours
        np.save(folder / f"s{index:02d}.npy", smooth.astype(np.float32))
    return folder


def batch_outputs(model: onnx.ModelProto | Path, feeds: list[np.ndarray], name: str = "x") -> np.ndarray:
    source = str(model) if isinstance(model, Path) else model.SerializeToString()
    session = ort.InferenceSession(source, providers=["CPUExecutionProvider"])
    return np.stack([session.run(None, {name: feed[None]})[0].ravel() for feed in feeds])


def zero_point_dtype(model: onnx.ModelProto, node: onnx.NodeProto) -> np.dtype:
    inits = {item.name: item for item in model.graph.initializer}
    return numpy_helper.to_array(inits[node.input[2]]).dtype


# ---- tests ----------------------------------------------------------------------------------


def test_ptq_puts_qdq_around_conv_with_uint8_activations_and_int8_weights(tmp_path: Path) -> None:
    folder = calib_folder(tmp_path)
    config = QuantizeConfig(calibration=CalibrationRef(data="calib"))
    result = quantize.run(save_artifact(tmp_path, tiny_conv()), config, stage_context(tmp_path, {"calib": folder}))
    model, made_by = result.model, producers(result.model)

    convs = [node for node in model.graph.node if node.op_type == "Conv"]
    assert len(convs) == 2
    for conv in convs:
        data_dq, weight_dq = made_by[conv.input[0]], made_by[conv.input[1]]
        assert data_dq.op_type == weight_dq.op_type == "DequantizeLinear"
        assert zero_point_dtype(model, data_dq) == np.uint8
        assert zero_point_dtype(model, weight_dq) == np.int8
        assert made_by[data_dq.input[0]].op_type == "QuantizeLinear"
    findings = result.findings
    assert findings.calibration_samples == 12 and findings.calibration_data == "calib"
    assert findings.quantized_nodes["Conv"] == 2
    assert (findings.activation_type, findings.weight_type, findings.per_channel) == ("uint8", "int8", True)
    json.dumps(findings.to_report())  # the report form is JSON

    feeds = [np.load(path) for path in sorted(folder.iterdir())]
    reference, quantized = batch_outputs(tiny_conv(), feeds), batch_outputs(model, feeds)
    assert min(cosine(r, q) for r, q in zip(reference, quantized, strict=True)) > 0.98


def test_demo_model_runs_int8_kernels_on_ort_and_openvino(tmp_path: Path) -> None:
    assert DEMO_MODEL.is_file(), "run recipes/make_demo_model.py"
    config = QuantizeConfig(calibration=CalibrationRef(data="val", samples=8))
    result = quantize.run(artifact_at(DEMO_MODEL), config, stage_context(tmp_path, {"val": DEMO_VAL}))
    assert result.findings.calibration_samples == 8
    assert result.findings.quantized_nodes["Conv"] == 8

    kernels = result.findings.int8_kernels
    assert kernels["ort:cpu"]["quantizable"] == 9  # 8 Conv and the classifier Gemm
    assert kernels["ort:cpu"]["int8_kernels"]["QLinearConv"] == 8
    assert kernels["ort:cpu"]["int8"] >= 8
    assert kernels["openvino:cpu"]["int8"] >= 8, kernels["openvino:cpu"]

    quantized_path = tmp_path / "q.onnx"
    onnx.save(result.model, str(quantized_path))
    feeds = [np.load(path) for path in sorted(DEMO_VAL.iterdir())]
    reference, quantized = batch_outputs(DEMO_MODEL, feeds, "input"), batch_outputs(quantized_path, feeds, "input")
    assert min(cosine(r, q) for r, q in zip(reference, quantized, strict=True)) > 0.98


def test_int8_kernel_counts_differ_per_target(tmp_path: Path) -> None:
    """A Conv with dequantized inputs but a float output: OpenVINO runs it in u8, ONNX Runtime in float
    (it fuses QLinearConv only with an output QuantizeLinear).  The per-target counts must show it."""
    weight = np.random.default_rng(0).integers(-100, 100, (8, 3, 3, 3)).astype(np.int8)
    nodes = [helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "xs", "xz"], ["xd"]),
             helper.make_node("DequantizeLinear", ["wq", "ws", "wz"], ["wd"], axis=0),
             helper.make_node("Conv", ["xd", "wd"], ["y"], name="conv", pads=[1, 1, 1, 1])]
    inits = [init("wq", weight, np.int8), init("ws", np.full(8, 0.01)), init("wz", np.zeros(8), np.int8),
             init("xs", 0.02), init("xz", 128, np.uint8)]
    model = make_model(nodes, inits, {"x": [1, 3, 16, 16]}, ["y"])
    path = tmp_path / "qdq.onnx"
    onnx.save(model, str(path))
    kernels = int8_kernels(path, model, ["ort:cpu", "openvino:cpu"], tmp_path)
    assert kernels["ort:cpu"]["quantizable"] == kernels["openvino:cpu"]["quantizable"] == 1
    assert kernels["ort:cpu"]["int8"] == 0 and kernels["ort:cpu"]["float_compute_kernels"]
    assert kernels["openvino:cpu"]["int8"] == 1
    assert kernels["openvino:cpu"]["int8_layers"] == {"Convolution": 1}


def test_already_quantized_model_is_refused_naming_what_it_holds(tmp_path: Path) -> None:
    once = quantize.run(save_artifact(tmp_path, tiny_conv()), QuantizeConfig(), stage_context(tmp_path))
    assert once.findings.calibration_data == "random" and once.findings.calibration_samples == 8
    count = sum(node.op_type in ("QuantizeLinear", "DequantizeLinear") for node in once.model.graph.node)
    with pytest.raises(StageError, match=rf"already quantized \({count} quantization nodes: DequantizeLinear \d+, "
                                         r"QuantizeLinear \d+\).*remove the quantize stage"):
        quantize.run(save_artifact(tmp_path, once.model, "twice.onnx"), QuantizeConfig(), stage_context(tmp_path))


def test_weight_quantize_linear_on_an_already_quantized_model_points_to_mode_lower(tmp_path: Path) -> None:
    weight = np.random.default_rng(0).standard_normal((4, 3, 3, 3)).astype(np.float32)
    nodes = [helper.make_node("QuantizeLinear", ["w", "ws", "wz"], ["wq"]),
             helper.make_node("DequantizeLinear", ["wq", "ws", "wz"], ["wd"]),
             helper.make_node("Conv", ["x", "wd"], ["y"], name="conv")]
    model = make_model(nodes, [init("w", weight), init("ws", 0.02), init("wz", 0, np.int8)], {"x": [1, 3, 8, 8]},
                       ["y"])
    with pytest.raises(StageError, match="use mode lower: 1 QuantizeLinear nodes act on float weights"):
        quantize.run(save_artifact(tmp_path, model), QuantizeConfig(), stage_context(tmp_path))


def test_dynamic_mode_on_matmul(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    weight = rng.standard_normal((16, 32)).astype(np.float32)
    model = make_model([helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")], [init("w", weight)],
                       {"x": [2, 16]}, ["y"])
    result = quantize.run(save_artifact(tmp_path, model), QuantizeConfig(mode="dynamic"), stage_context(tmp_path))
    ops = {node.op_type for node in result.model.graph.node}
    assert {"DynamicQuantizeLinear", "MatMulInteger"} <= ops and "MatMul" not in ops
    assert result.findings.quantized_nodes == {"MatMulInteger": 1}
    assert result.findings.int8_kernels["ort:cpu"]["int8"] == 1
    x = rng.standard_normal((2, 16)).astype(np.float32)
    assert cosine(run_ort(result.model, {"x": x})[0], x @ weight) > 0.99


def test_dynamic_mode_leaves_conv_float_with_int8_weights(tmp_path: Path) -> None:
    """ORT has no int8-weight ConvInteger kernel: the default dynamic op set leaves Conv out, the model loads."""
    result = quantize.run(save_artifact(tmp_path, tiny_conv()), QuantizeConfig(mode="dynamic"),
                          stage_context(tmp_path))
    assert "Conv" not in result.findings.op_types
    assert sum(node.op_type == "Conv" for node in result.model.graph.node) == 2


def test_a_quantized_model_onnx_runtime_crashes_on_fails_its_variant_not_the_run(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The load check runs in a child process: ONNX Runtime's optimisers segfault on some graphs, and in the run's
    own process that ended the run without a report."""
    from qdeploy.targets import ort_probe
    from tests.helpers.fresh import crashing_on

    monkeypatch.setattr(ort_probe, "call_isolated", crashing_on(".onnx", "onnxruntime"))
    model = make_model([helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")],
                       [init("w", np.ones((16, 32), np.float32))], {"x": [2, 16]}, ["y"])
    with pytest.raises(StageError, match=r"does not load in ONNX Runtime: ONNX Runtime crashed .*signal 11.*exclude"):
        quantize.run(save_artifact(tmp_path, model), QuantizeConfig(mode="dynamic"), stage_context(tmp_path))


def test_exclusions_by_name_op_type_and_pattern(tmp_path: Path) -> None:
    config = QuantizeConfig(exclude_op_types=["Gemm"], exclude_patterns=[r"^conv2$"], exclude_nodes=["relu1"])
    result = quantize.run(save_artifact(tmp_path, tiny_conv()), config, stage_context(tmp_path))
    made_by = producers(result.model)
    nodes = {node.name: node for node in result.model.graph.node}
    floats = {item.name for item in result.model.graph.initializer if item.data_type == TensorProto.FLOAT}
    for name in ("conv2", "fc"):  # weights and bias stay float initializers
        assert set(nodes[name].input[1:]) <= floats, nodes[name].input
    assert made_by[nodes["conv1"].input[1]].op_type == "DequantizeLinear"
    assert result.findings.excluded == ["conv2", "fc", "relu1"]
    assert result.findings.quantized_nodes["Conv"] == 1 and "Gemm" not in result.findings.quantized_nodes


def test_unknown_excluded_node_is_a_stage_error(tmp_path: Path) -> None:
    with pytest.raises(StageError, match="conv9"):
        quantize.run(save_artifact(tmp_path, tiny_conv()), QuantizeConfig(exclude_nodes=["conv9"]),
                     stage_context(tmp_path))


def test_weights_in_constant_nodes_are_quantized(tmp_path: Path) -> None:
    """Paddle keeps weights in Constant nodes; ORT's quantizer alone would leave them float."""
    model = tiny_conv()
    for item in list(model.graph.initializer):
        model.graph.node.insert(0, helper.make_node("Constant", [], [item.name], value=item))
        model.graph.initializer.remove(item)
    result = quantize.run(save_artifact(tmp_path, model), QuantizeConfig(), stage_context(tmp_path))
    assert result.findings.constants_lifted == 6
    made_by = producers(result.model)
    convs = [node for node in result.model.graph.node if node.op_type == "Conv"]
    assert [made_by[conv.input[1]].op_type for conv in convs] == ["DequantizeLinear"] * 2
    assert zero_point_dtype(result.model, made_by[convs[0].input[1]]) == np.int8
    x = np.random.default_rng(1).standard_normal((1, 3, 16, 16)).astype(np.float32)
    assert cosine(run_ort(result.model, {"x": x})[0], run_ort(tiny_conv(), {"x": x})[0]) > 0.98


def test_model_with_a_subgraph_is_quantized_outside_it(tmp_path: Path) -> None:
    """An If node's branches stay float (reported); the main graph's Conv is quantized and the model runs."""
    weight = np.random.default_rng(2).standard_normal((4, 3, 3, 3)).astype(np.float32) * 0.3
    then_graph = helper.make_graph([helper.make_node("Relu", ["c"], ["t"])], "then", [],
                                   [helper.make_tensor_value_info("t", TensorProto.FLOAT, None)])
    else_graph = helper.make_graph([helper.make_node("Neg", ["c"], ["e"])], "else", [],
                                   [helper.make_tensor_value_info("e", TensorProto.FLOAT, None)])
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("ReduceSum", ["x"], ["s"], name="sum", keepdims=0),
             helper.make_node("Greater", ["s", "zero"], ["cond"], name="greater"),
             helper.make_node("If", ["cond"], ["y"], name="branch", then_branch=then_graph, else_branch=else_graph)]
    model = make_model(nodes, [init("w", weight), init("zero", 0.0)], {"x": [1, 3, 8, 8]}, ["y"])
    result = quantize.run(save_artifact(tmp_path, model), QuantizeConfig(), stage_context(tmp_path))
    assert result.findings.subgraphs_left_float == [{"node": "branch", "op_type": "If", "body_nodes": 2}]
    assert result.findings.quantized_nodes["Conv"] == 1
    rng = np.random.default_rng(4)
    for _ in range(3):
        x = rng.standard_normal((1, 3, 8, 8)).astype(np.float32)
        assert cosine(run_ort(result.model, {"x": x})[0], run_ort(model, {"x": x})[0]) > 0.98


def test_an_activation_read_by_a_branch_is_kept_when_the_quantizer_would_fold_it(tmp_path: Path) -> None:
    """ORT's QDQ quantizer drops a Relu after a quantized Conv and renames the Conv's output to the Relu's
    (uint8 clips in its place), counting only main-graph readers: an If body reading the Relu's output from
    the outer scope then read negative values nothing clipped (silero-vad: cosine 0.56 with every node kept
    float).  The Relu stays, and both branches agree with the float model."""
    rng = np.random.default_rng(5)
    w1, w2 = (rng.standard_normal((4, c, 3, 3)).astype(np.float32) * 0.3 for c in (3, 4))
    then_graph = helper.make_graph([helper.make_node("Identity", ["r"], ["t"])], "then", [],
                                   [helper.make_tensor_value_info("t", TensorProto.FLOAT, None)])
    else_graph = helper.make_graph([helper.make_node("Neg", ["r"], ["e"])], "else", [],
                                   [helper.make_tensor_value_info("e", TensorProto.FLOAT, None)])
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"], name="relu"),
             helper.make_node("Conv", ["r", "w2"], ["z"], name="conv2", pads=[1, 1, 1, 1]),
             helper.make_node("ReduceSum", ["x"], ["s"], name="sum", keepdims=0),
             helper.make_node("Greater", ["s", "zero"], ["cond"], name="greater"),
             helper.make_node("If", ["cond"], ["y"], name="branch", then_branch=then_graph, else_branch=else_graph)]
    model = make_model(nodes, [init("w1", w1), init("w2", w2), init("zero", 0.0)], {"x": [1, 3, 8, 8]}, ["y", "z"])
    result = quantize.run(save_artifact(tmp_path, model), QuantizeConfig(), stage_context(tmp_path))
    assert result.findings.quantized_nodes["Conv"] == 2
    assert any(node.op_type == "Relu" for node in result.model.graph.node)
    for sign in (1.0, -1.0):  # both branches
        x = sign * np.abs(rng.standard_normal((1, 3, 8, 8))).astype(np.float32)
        got, expected = run_ort(result.model, {"x": x})[0], run_ort(model, {"x": x})[0]
        assert expected.min() >= 0 if sign > 0 else expected.max() <= 0
        assert cosine(got, expected) > 0.98


@pytest.mark.parametrize("method", ["minmax", "percentile", "entropy", "mse"])
def test_each_range_method_quantizes_the_model_well(tmp_path: Path, method: str) -> None:
    folder = calib_folder(tmp_path)
    config = QuantizeConfig(method=method, calibration=CalibrationRef(data="calib"), verify_targets=["ort:cpu"])
    result = quantize.run(save_artifact(tmp_path, tiny_conv()), config, stage_context(tmp_path, {"calib": folder}))
    assert result.findings.method == method
    if method == "minmax":
        assert result.findings.ranges_clipped == 0
    feeds = [np.load(path) for path in sorted(folder.iterdir())]
    reference, quantized = batch_outputs(tiny_conv(), feeds), batch_outputs(result.model, feeds)
    assert min(cosine(r, q) for r, q in zip(reference, quantized, strict=True)) > 0.97


def test_symmetric_activations_give_midpoint_zero_points(tmp_path: Path) -> None:
    config = QuantizeConfig(symmetric_activations=True, verify_targets=[])
    result = quantize.run(save_artifact(tmp_path, tiny_conv()), config, stage_context(tmp_path))
    made_by = producers(result.model)
    conv = next(node for node in result.model.graph.node if node.name == "conv1")
    zero_name = made_by[conv.input[0]].input[2]
    zero = next(numpy_helper.to_array(item) for item in result.model.graph.initializer if item.name == zero_name)
    assert zero.dtype == np.uint8 and int(zero) == 128
    assert result.findings.int8_kernels == {}


@pytest.mark.parametrize("config", [QuantizeConfig(mode="dynamic"), QuantizeConfig(calibration={"data": "calib"}),
                                    QuantizeConfig(mode="lower", calibration={"data": "calib"}),
                                    QuantizeConfig(tolerance={"cosine_min": 0.98}, budget={"samples": 4})])
def test_config_survives_a_json_round_trip(config: QuantizeConfig) -> None:
    assert QuantizeConfig(**config.model_dump(mode="json")) == config


@pytest.mark.parametrize("bad", [
    {"activation_type": "int8", "weight_type": "uint8"},
    {"mode": "dynamic", "calibration": {"data": "calib"}},
    {"mode": "dynamic", "method": "entropy"},
    {"mode": "lower", "tolerance": {"cosine_min": 0.98}},
    {"mode": "lower", "exclude_nodes": ["conv"]},
    {"op_types": ["Conv"], "exclude_op_types": ["Conv"]},
    {"calibration": {"samples": 0}},
    {"percentile": 99.9},
    {"exclude_patterns": ["conv(["]},
    {"budget": {"samples": 4}},
    {"tolerance": {}},
    {"verify_targets": ["ort:cuda"]},
    {"unknown": True},
])
def test_bad_config_is_rejected(bad: dict) -> None:
    with pytest.raises(ValidationError):
        QuantizeConfig(**bad)


def test_recipe_with_an_image_dataset_a_budget_and_a_lowered_variant_runs_end_to_end(tmp_path: Path) -> None:
    """Through the loader and runner: images calibrate ptq (with a budget) and verify a lowered QAT model."""
    from PIL import Image

    from qdeploy.pipeline.recipe.loader import load_recipe_file
    from qdeploy.pipeline.run.runner import RunOptions, run_recipe
    from tests.helpers.models import write_recipe

    folder = tmp_path / "imgs"
    folder.mkdir()
    rng = np.random.default_rng(0)
    for index in range(4):
        Image.fromarray(rng.integers(0, 256, (20, 20, 3)).astype(np.uint8)).save(folder / f"{index}.png")
    onnx.save(tiny_conv(), str(tmp_path / "float.onnx"))
    weight = rng.standard_normal((8, 3, 3, 3)).astype(np.float32) * 0.2
    fq = [helper.make_node("FakeQuantize", ["x", "lo", "hi", "lo", "hi"], ["xq"], domain="org.openvinotoolkit",
                           levels=256),
          helper.make_node("FakeQuantize", ["w", "wlo", "whi", "wlo", "whi"], ["wq"], domain="org.openvinotoolkit",
                           levels=255),
          helper.make_node("Conv", ["xq", "wq"], ["y"], pads=[1, 1, 1, 1])]
    inits = [init("lo", 0.0), init("hi", 255 / 256), init("w", weight), init("wlo", -1.0), init("whi", 1.0)]
    onnx.save(make_model(fq, inits, {"x": [1, 3, 16, 16]}, {"y": [1, 8, 16, 16]}, domains=("org.openvinotoolkit",)),
              str(tmp_path / "qat.onnx"))
    body = """
        name: {name}
        model: {{onnx: {model}}}
        data:
          imgs: {{reader: images, path: imgs, samples: 4}}
        variants:
          int8: [{{quantize: {config}}}]
        targets: [ort:cpu]
        validate: {{data: imgs, samples: 2, reference: {reference}}}
        benchmark: {{enabled: false}}
        """
    ptq = "{calibration: {data: imgs}, tolerance: {cosine_min: 0.9}, budget: {samples: 2}}"
    lowered = "{mode: lower, calibration: {data: imgs}}"
    # ORT cannot run the QAT model's FakeQuantize: its lowered variant is the reference there
    for name, model, config, reference in (("ptq", "float.onnx", ptq, "exported"),
                                           ("lower", "qat.onnx", lowered, "int8")):
        text = body.format(name=name, model=model, config=config, reference=reference)
        recipe = write_recipe(tmp_path, text, f"{name}.yaml")
        result = run_recipe(load_recipe_file(recipe), RunOptions(out_dir=tmp_path / name, show_progress=False))
        assert result.exit_code == 0, result.report.get("failures")
        sidecar = json.loads((tmp_path / name / "artifacts" / "int8.json").read_text())
        findings = next(step["findings"] for step in sidecar["lineage"] if step["stage"] == "quantize")
        if name == "ptq":
            # the budget's held-back sample (the second of its 2) is left out of calibration: 3 of the 4 images
            assert findings["calibration_samples"] == 3 and findings["calibration_skipped"] == [1]
            assert findings["budget"]["met"]
            assert findings["int8_kernels"]["ort:cpu"]["int8"] == 3
        else:  # the Conv has a dequantized input but a float output: int8 on OpenVINO only
            assert findings["verification"]["data"] == "imgs" and findings["verification"]["samples"] == 4
            assert (findings["int8_kernels"]["ort:cpu"]["int8"], findings["int8_kernels"]["openvino:cpu"]["int8"]) \
                == (0, 1)


def test_quantized_model_passes_the_onnx_checker(tmp_path: Path) -> None:
    """Nodes topologically sorted (ORT's quantizer appends its Q/DQ nodes last), types consistent."""
    result = quantize.run(save_artifact(tmp_path, tiny_conv()), QuantizeConfig(verify_targets=[]),
                          stage_context(tmp_path))
    onnx.checker.check_model(result.model, full_check=True)
