"""The quantize stage: QDQ around convolutions, int8 kernels in ORT, refusals, dynamic mode, exclusions."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from pydantic import ValidationError

from pipeline.context import Artifact, StageContext
from pipeline.errors import StageError
from stages import quantize
from stages.quantize import CalibrationRef, QuantizeConfig

REPO = Path(__file__).resolve().parents[2]
DEMO_MODEL = REPO / "recipes" / "models" / "demo_cnn.onnx"
DEMO_VAL = REPO / "recipes" / "data" / "val"

# ---- helpers (kept in this file on purpose) -------------------------------------------------


def _save(tmp_path: Path, model: onnx.ModelProto, name: str = "model.onnx") -> Artifact:
    path = tmp_path / name
    onnx.save(model, str(path))
    return Artifact(path=path, sidecar=path.with_suffix(".json"), key="k", sha256="s",
                    size_bytes=path.stat().st_size, stages=("export",), parent=None)


def _artifact_at(path: Path) -> Artifact:
    return Artifact(path=path, sidecar=path.with_suffix(".json"), key="k", sha256="s",
                    size_bytes=path.stat().st_size, stages=("export",), parent=None)


def _ctx(tmp_path: Path, datasets: dict[str, Path] | None = None) -> StageContext:
    data = {name: SimpleNamespace(reader="npy", path=str(folder), samples=None, seed=0)
            for name, folder in (datasets or {}).items()}
    recipe = SimpleNamespace(data=data, model=SimpleNamespace(inputs=[]), resolve=lambda p: tmp_path / p)
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    return StageContext(recipe=recipe, variant="v", work_dir=work)  # type: ignore[arg-type]


def _tiny_conv() -> onnx.ModelProto:
    """Conv -> Relu -> Conv -> Relu -> GlobalAveragePool -> Flatten -> Gemm; input x [1,3,16,16]."""
    rng = np.random.default_rng(0)

    def weight(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * np.sqrt(2.0 / np.prod(shape[1:]))).astype(np.float32)

    inits = [numpy_helper.from_array(weight(8, 3, 3, 3), "w1"), numpy_helper.from_array(weight(8, 8, 3, 3), "w2"),
             numpy_helper.from_array(rng.uniform(0, 0.2, 8).astype(np.float32), "b1"),
             numpy_helper.from_array(rng.uniform(0, 0.2, 8).astype(np.float32), "b2"),
             numpy_helper.from_array(weight(10, 8), "fc"), numpy_helper.from_array(np.zeros(10, np.float32), "fcb")]
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
             helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], name="conv2", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c2"], ["r2"], name="relu2"),
             helper.make_node("GlobalAveragePool", ["r2"], ["p"], name="pool"),
             helper.make_node("Flatten", ["p"], ["f"], name="flatten"),
             helper.make_node("Gemm", ["f", "fc", "fcb"], ["y"], name="fc", transB=1)]
    graph = helper.make_graph(nodes, "tiny", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _calib_folder(tmp_path: Path, count: int = 12) -> Path:
    folder = tmp_path / "calib"
    folder.mkdir()
    rng = np.random.default_rng(3)
    for index in range(count):
        smooth = np.cumsum(rng.standard_normal((3, 16, 16)), axis=2) / 4  # image-like: correlated neighbours
        np.save(folder / f"s{index:02d}.npy", smooth.astype(np.float32))
    return folder


def _outputs(model: onnx.ModelProto | Path, feeds: list[np.ndarray], name: str = "x") -> np.ndarray:
    source = str(model) if isinstance(model, Path) else model.SerializeToString()
    session = ort.InferenceSession(source, providers=["CPUExecutionProvider"])
    return np.stack([session.run(None, {name: feed[None]})[0].ravel() for feed in feeds])


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float((a * b).sum() / (np.linalg.norm(a) * np.linalg.norm(b)))


def _producers(model: onnx.ModelProto) -> dict[str, onnx.NodeProto]:
    return {out: node for node in model.graph.node for out in node.output}


def _zero_point_dtype(model: onnx.ModelProto, node: onnx.NodeProto) -> np.dtype:
    inits = {init.name: init for init in model.graph.initializer}
    return numpy_helper.to_array(inits[node.input[2]]).dtype


# ---- tests ----------------------------------------------------------------------------------


def test_ptq_puts_qdq_around_conv_with_uint8_activations_and_int8_weights(tmp_path: Path) -> None:
    folder = _calib_folder(tmp_path)
    config = QuantizeConfig(calibration=CalibrationRef(data="calib"))
    result = quantize.run(_save(tmp_path, _tiny_conv()), config, _ctx(tmp_path, {"calib": folder}))
    model, producers = result.model, _producers(result.model)

    convs = [node for node in model.graph.node if node.op_type == "Conv"]
    assert len(convs) == 2
    for conv in convs:
        data_dq, weight_dq = producers[conv.input[0]], producers[conv.input[1]]
        assert data_dq.op_type == weight_dq.op_type == "DequantizeLinear"
        assert _zero_point_dtype(model, data_dq) == np.uint8
        assert _zero_point_dtype(model, weight_dq) == np.int8
        assert producers[data_dq.input[0]].op_type == "QuantizeLinear" or data_dq.input[0] in {
            i.name for i in model.graph.initializer}
    findings = result.findings
    assert findings["calibration_samples"] == 12 and findings["calibration_data"] == "calib"
    assert findings["quantized_nodes"]["Conv"] == 2
    assert (findings["activation_type"], findings["weight_type"], findings["per_channel"]) == ("uint8", "int8", True)
    json.dumps(findings)

    feeds = [np.load(path) for path in sorted(folder.iterdir())]
    reference, quantized = _outputs(_tiny_conv(), feeds), _outputs(model, feeds)
    assert min(_cosine(r, q) for r, q in zip(reference, quantized, strict=True)) > 0.98


def test_demo_model_runs_int8_kernels_in_ort(tmp_path: Path) -> None:
    assert DEMO_MODEL.is_file(), "run recipes/make_demo_model.py"
    config = QuantizeConfig(calibration=CalibrationRef(data="val", samples=8))
    result = quantize.run(_artifact_at(DEMO_MODEL), config, _ctx(tmp_path, {"val": DEMO_VAL}))
    assert result.findings["calibration_samples"] == 8
    assert result.findings["quantized_nodes"]["Conv"] == 8

    quantized_path, optimized_path = tmp_path / "q.onnx", tmp_path / "optimized.onnx"
    onnx.save(result.model, str(quantized_path))
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    options.optimized_model_filepath = str(optimized_path)
    ort.InferenceSession(str(quantized_path), options, providers=["CPUExecutionProvider"])
    ops = [node.op_type for node in onnx.load(str(optimized_path)).graph.node]
    assert ops.count("QLinearConv") == 8, ops

    feeds = [np.load(path) for path in sorted(DEMO_VAL.iterdir())]
    reference, quantized = _outputs(DEMO_MODEL, feeds, "input"), _outputs(quantized_path, feeds, "input")
    assert min(_cosine(r, q) for r, q in zip(reference, quantized, strict=True)) > 0.98


def test_already_quantized_model_is_refused(tmp_path: Path) -> None:
    once = quantize.run(_save(tmp_path, _tiny_conv()), QuantizeConfig(), _ctx(tmp_path))
    assert once.findings["calibration_data"] == "random" and once.findings["calibration_samples"] == 8
    with pytest.raises(StageError, match=r"already quantized \(\d+ QDQ nodes\).*mode lower"):
        quantize.run(_save(tmp_path, once.model, "twice.onnx"), QuantizeConfig(), _ctx(tmp_path))


def test_dynamic_mode_on_matmul(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((16, 32)).astype(np.float32), "w")]
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")], "mm",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 32])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    result = quantize.run(_save(tmp_path, model), QuantizeConfig(mode="dynamic"), _ctx(tmp_path))
    ops = {node.op_type for node in result.model.graph.node}
    assert {"DynamicQuantizeLinear", "MatMulInteger"} <= ops and "MatMul" not in ops
    assert result.findings["quantized_nodes"] == {"MatMulInteger": 1}
    x = rng.standard_normal((2, 16)).astype(np.float32)
    session = ort.InferenceSession(result.model.SerializeToString(), providers=["CPUExecutionProvider"])
    expected = x @ numpy_helper.to_array(inits[0])
    assert _cosine(session.run(None, {"x": x})[0], expected) > 0.99


def test_exclusions_are_honoured(tmp_path: Path) -> None:
    config = QuantizeConfig(exclude_op_types=["Gemm"], exclude_nodes=["conv2"])
    result = quantize.run(_save(tmp_path, _tiny_conv()), config, _ctx(tmp_path))
    producers = _producers(result.model)
    nodes = {node.name: node for node in result.model.graph.node}
    floats = {init.name for init in result.model.graph.initializer if init.data_type == TensorProto.FLOAT}
    for name in ("conv2", "fc"):  # weights and bias stay float initializers
        assert set(nodes[name].input[1:]) <= floats, nodes[name].input
    assert producers[nodes["conv1"].input[1]].op_type == "DequantizeLinear"
    assert result.findings["excluded"] == ["conv2", "fc"]
    assert result.findings["quantized_nodes"]["Conv"] == 1 and "Gemm" not in result.findings["quantized_nodes"]


def test_unknown_excluded_node_is_a_stage_error(tmp_path: Path) -> None:
    with pytest.raises(StageError, match="conv9"):
        quantize.run(_save(tmp_path, _tiny_conv()), QuantizeConfig(exclude_nodes=["conv9"]), _ctx(tmp_path))


@pytest.mark.parametrize("config", [QuantizeConfig(mode="dynamic"), QuantizeConfig(calibration={"data": "calib"})])
def test_config_survives_a_json_round_trip(config: QuantizeConfig) -> None:
    assert QuantizeConfig(**config.model_dump(mode="json")) == config


@pytest.mark.parametrize("bad", [
    {"activation_type": "int8", "weight_type": "uint8"},
    {"mode": "dynamic", "calibration": {"data": "calib"}},
    {"mode": "lower"},
    {"op_types": ["Conv"], "exclude_op_types": ["Conv"]},
    {"calibration": {"samples": 0}},
    {"unknown": True},
])
def test_bad_config_is_rejected(bad: dict) -> None:
    with pytest.raises(ValidationError):
        QuantizeConfig(**bad)
