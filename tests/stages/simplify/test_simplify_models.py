"""Models of the kinds users bring, through export and simplify: outputs unchanged within float32 rounding.

Real models (PP-OCR, exported from Paddle with weights in Constant nodes) come
from the rapidocr-onnxruntime wheel through ``tests.real_models``; the others
are built here: PyTorch exports (a small CNN detector with both exporters, a
transformer encoder on token ids, an LSTM), an ``ai.onnx.ml`` classifier and an
already quantized QDQ model.
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from qdeploy.core.context import Artifact, StageContext, StageResult
from qdeploy.pipeline.recipe.schema import Recipe
from qdeploy.stages import export, simplify
from tests.helpers.models import tiny_cnn
from tests.real_models import PP_OCR_DET, PP_OCR_REC, real_model

RNG = np.random.default_rng(11)

TORCH_MODELS = '''
import torch
from torch import nn


class Detector(nn.Module):
    """A tiny one-stage detector: strided conv backbone, a top-down upsample-and-add neck, two heads."""

    def __init__(self):
        super().__init__()
        def block(cin, cout, stride):
            return nn.Sequential(nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout), nn.SiLU())
        self.c1, self.c2, self.c3 = block(3, 8, 2), block(8, 16, 2), block(16, 32, 2)
        self.lateral = nn.Conv2d(16, 32, 1)
        self.cls = nn.Conv2d(32, 3, 1)
        self.box = nn.Conv2d(32, 4, 1)

    def forward(self, x):
        p2 = self.c2(self.c1(x))
        p3 = self.c3(p2)
        fused = self.lateral(p2) + nn.functional.interpolate(p3, scale_factor=2.0, mode="nearest")
        return torch.sigmoid(self.cls(fused)), self.box(fused).relu()


class Encoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(50, 32)
        layer = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(32, 5)

    def forward(self, ids):
        return self.head(self.encoder(self.embed(ids)))


class Recurrent(nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(6, 12, num_layers=2, batch_first=True)
        self.out = nn.Linear(12, 3)

    def forward(self, x):
        seq, _ = self.lstm(x)
        return self.out(seq[:, -1])


def _built(cls):
    torch.manual_seed(0)
    model = cls()
    for module in model.modules():  # BatchNorm statistics that are not the identity
        if isinstance(module, nn.BatchNorm2d):
            module.running_mean.uniform_(-0.5, 0.5)
            module.running_var.uniform_(0.5, 2.0)
    return model


def detector():
    return _built(Detector)


def encoder():
    return _built(Encoder)


def recurrent():
    return _built(Recurrent)
'''


def _recipe(model: dict[str, Any]) -> Recipe:
    return Recipe(name="t", model=model, variants={"v": []})


def _ctx(tmp_path: Path, model: dict[str, Any]) -> StageContext:
    ctx = _recipe(model).stage_context("v", tmp_path / "work")
    ctx.work_dir.mkdir(parents=True, exist_ok=True)
    return ctx


def _export_then_simplify(tmp_path: Path, model: dict[str, Any],
                          **config: Any) -> tuple[StageResult, StageResult, Path]:
    """Run export, save its model as an artifact, run simplify on it; both results and the exported file."""
    ctx = _ctx(tmp_path, model)
    exported = export.run(None, _recipe(model).model, ctx)
    path = tmp_path / "exported.onnx"
    onnx.save(exported.model, path)
    artifact = Artifact(path=path, sidecar=tmp_path / "exported.json", key="k", sha256="", size_bytes=0,
                        stages=("export",), parent=None)
    simplified = simplify.run(artifact, simplify.SimplifyConfig(**config), ctx)
    onnx.checker.check_model(simplified.model)
    return exported, simplified, path


def _outputs(model: onnx.ModelProto | Path, feeds: dict[str, np.ndarray]) -> list[Any]:
    source = str(model) if isinstance(model, Path) else model.SerializeToString()
    return ort.InferenceSession(source, providers=["CPUExecutionProvider"]).run(None, feeds)


def _max_error(original: Path, simplified: onnx.ModelProto, feeds: dict[str, np.ndarray], rtol: float = 1e-4,
               atol: float = 1e-5) -> float:
    """Largest absolute difference over every output; asserts the float32-rounding tolerance on each."""
    worst = 0.0
    for want, got in zip(_outputs(original, feeds), _outputs(simplified, feeds), strict=True):
        want, got = np.asarray(want), np.asarray(got)
        assert want.dtype == got.dtype and want.shape == got.shape
        if want.dtype.kind in "iub":
            np.testing.assert_array_equal(got, want)
            continue
        np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)
        worst = max(worst, float(np.max(np.abs(got.astype(np.float64) - want))))
    return worst


def _ops(model: onnx.ModelProto) -> set[str]:
    return {node.op_type for node in model.graph.node}


@pytest.mark.slow
@pytest.mark.parametrize(("relative", "shape"), [(PP_OCR_DET, [1, 3, 160, 160]), (PP_OCR_REC, [1, 3, 48, 160])])
def test_pp_ocr_paddle_models(tmp_path: Path, relative: str, shape: list[int]) -> None:
    path = real_model(relative)
    original = onnx.load(str(path))
    assert "Constant" in _ops(original)  # Paddle keeps its weights in Constant nodes
    # Fix the symbolic batch and the missing ('?') or symbolic image sizes before simplifying.
    _exported, result, exported_path = _export_then_simplify(tmp_path, {"onnx": str(path),
                                                                       "inputs": [{"name": "x", "shape": shape}]})
    findings = result.findings
    assert "Constant" not in _ops(result.model)  # ... which end up as initializers, ready to quantize
    assert findings.constants_converted > 300
    assert findings.node_count_after < 0.6 * findings.node_count_before
    assert "BatchNormalization" not in _ops(result.model)
    assert findings.check.samples == 3 and findings.check.max_abs_err < 1e-3
    feeds = {"x": RNG.standard_normal(shape).astype(np.float32)}
    assert _max_error(exported_path, result.model, feeds, rtol=1e-3, atol=1e-4) < 1e-3


def _torch_source(tmp_path: Path) -> Path:
    path = tmp_path / "models.py"
    path.write_text(textwrap.dedent(TORCH_MODELS))
    return path


@pytest.mark.torch
@pytest.mark.parametrize("exporter", ["torchscript", pytest.param("dynamo", marks=pytest.mark.slow)])
def test_cnn_detector_from_pytorch(tmp_path: Path, exporter: str) -> None:
    pytest.importorskip("torch")
    source = _torch_source(tmp_path)
    model = {"torch": {"factory": f"{source}:detector", "exporter": exporter},
             "inputs": [{"name": "image", "shape": [1, 3, 32, 32]}]}
    exported, result, path = _export_then_simplify(tmp_path, model)
    assert exported.findings.max_abs_err_vs_torch < 1e-4
    assert "BatchNormalization" not in _ops(result.model)
    assert result.findings.node_count_after <= result.findings.node_count_before
    feeds = {"image": RNG.standard_normal((1, 3, 32, 32)).astype(np.float32)}
    assert _max_error(path, result.model, feeds) < 1e-4


@pytest.mark.torch
def test_transformer_encoder_on_token_ids(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    source = _torch_source(tmp_path)
    model = {"torch": {"factory": f"{source}:encoder"},
             "inputs": [{"name": "ids", "shape": [1, 12], "dtype": "int64", "low": 0, "high": 50}]}
    exported, result, path = _export_then_simplify(tmp_path, model)
    assert exported.findings.max_abs_err_vs_torch < 1e-4
    check = result.findings.check
    assert check.samples == 3 and check.max_abs_err < 1e-4, check
    assert result.findings.node_count_after < result.findings.node_count_before
    feeds = {"ids": RNG.integers(0, 50, (1, 12)).astype(np.int64)}
    assert _max_error(path, result.model, feeds) < 1e-4


@pytest.mark.torch
def test_lstm_from_pytorch(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    source = _torch_source(tmp_path)
    model = {"torch": {"factory": f"{source}:recurrent"}, "inputs": [{"name": "x", "shape": [2, 7, 6]}]}
    _exported, result, path = _export_then_simplify(tmp_path, model)
    assert "LSTM" in _ops(result.model)
    assert result.findings.check.samples == 3
    assert _max_error(path, result.model, {"x": RNG.standard_normal((2, 7, 6)).astype(np.float32)}) < 1e-5


def _ml_classifier() -> onnx.ModelProto:
    """Scaler -> LinearClassifier -> Normalizer, as skl2onnx/tf2onnx write them (ai.onnx.ml domain)."""
    coefficients = RNG.standard_normal(3 * 4).astype(np.float32)
    nodes = [
        helper.make_node("Scaler", ["x"], ["scaled"], domain="ai.onnx.ml", offset=[0.5, -1.0, 0.0, 2.0],
                         scale=[2.0, 0.5, 1.0, 0.25]),
        helper.make_node("LinearClassifier", ["scaled"], ["label", "scores"], domain="ai.onnx.ml",
                         coefficients=coefficients.tolist(), intercepts=[0.1, -0.2, 0.3], classlabels_ints=[0, 1, 2],
                         post_transform="LOGISTIC"),
        helper.make_node("Normalizer", ["scores"], ["probabilities"], domain="ai.onnx.ml", norm="L1"),
        helper.make_node("Identity", ["label"], ["label_out"]),
    ]
    graph = helper.make_graph(nodes, "ml", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
                              [helper.make_tensor_value_info("label_out", TensorProto.INT64, ["N"]),
                               helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, ["N", 3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.ml", 3)])
    model.ir_version = 8
    return model


def test_ai_onnx_ml_classifier(tmp_path: Path) -> None:
    onnx.save(_ml_classifier(), tmp_path / "ml.onnx")
    _exported, result, path = _export_then_simplify(tmp_path, {"onnx": str(tmp_path / "ml.onnx")})
    assert {"ai.onnx.ml:Scaler", "ai.onnx.ml:LinearClassifier", "ai.onnx.ml:Normalizer"} <= set(
        result.findings.nodes_after)
    assert "Identity" not in _ops(result.model) and result.findings.check.samples == 3
    assert _max_error(path, result.model, {"x": RNG.standard_normal((5, 4)).astype(np.float32)}) == 0.0


def _quantized_cnn(tmp_path: Path) -> Path:
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.samples = iter([{"input": RNG.standard_normal((1, 3, 16, 16)).astype(np.float32)} for _ in range(4)])

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self.samples, None)

    onnx.save(tiny_cnn(), tmp_path / "float.onnx")
    quantize_static(str(tmp_path / "float.onnx"), str(tmp_path / "qdq.onnx"), Reader(), quant_format=QuantFormat.QDQ,
                    activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)
    return tmp_path / "qdq.onnx"


def test_already_quantized_qdq_model_keeps_its_quantized_weights(tmp_path: Path) -> None:
    path = _quantized_cnn(tmp_path)
    original = onnx.load(str(path))
    int8_weights = {init.name for init in original.graph.initializer  # zero points (scalars) may be merged
                    if init.data_type == TensorProto.INT8 and len(init.dims)}
    _exported, result, exported_path = _export_then_simplify(tmp_path, {"onnx": str(path)})
    after = {init.name: init.data_type for init in result.model.graph.initializer}
    assert int8_weights and all(after.get(name) == TensorProto.INT8 for name in int8_weights)
    counts = result.findings.nodes_after
    assert counts["DequantizeLinear"] == result.findings.nodes_before["DequantizeLinear"]
    feeds = {"input": RNG.standard_normal((1, 3, 16, 16)).astype(np.float32)}
    assert _max_error(exported_path, result.model, feeds, rtol=0, atol=1e-6) <= 1e-6


def test_weights_in_constant_nodes_end_up_as_initializers(tmp_path: Path) -> None:
    weight = numpy_helper.from_array(RNG.standard_normal((8, 3, 3, 3)).astype(np.float32), "w_value")
    nodes = [helper.make_node("Constant", [], ["w"], value=weight), helper.make_node("Conv", ["x", "w"], ["y"])]
    graph = helper.make_graph(nodes, "paddle_like", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                                   [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 6, 6])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 12)])
    model.ir_version = 7
    onnx.save(model, tmp_path / "m.onnx")
    _, result, path = _export_then_simplify(tmp_path, {"onnx": str(tmp_path / "m.onnx")})
    assert [node.op_type for node in result.model.graph.node] == ["Conv"]
    assert result.model.graph.node[0].input[1] in {init.name for init in result.model.graph.initializer}
    assert _max_error(path, result.model, {"x": RNG.standard_normal((1, 3, 8, 8)).astype(np.float32)}) == 0.0
