"""int8 of a model ONNX Runtime's pre-processing optimized: the names its optimizer wrote do not collide with the
names it writes when the int8 model is loaded (``qdeploy.graph.names.rename_optimizer_tensors``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import onnxruntime as ort
import pytest

import qdeploy

pytestmark = [pytest.mark.slow, pytest.mark.torch]


def tiny_wav2vec2() -> Any:
    """A freshly initialised two-layer Wav2Vec2 for CTC (transformers): its equal zero biases and the 3-D
    MatMul + Add pairs of its encoder are what made the collision."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.Wav2Vec2Config(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128, conv_dim=(32, 32, 32),
        conv_stride=(5, 2, 2), conv_kernel=(10, 3, 3), vocab_size=32, num_conv_pos_embeddings=16,
        num_conv_pos_embedding_groups=4)

    class Logits(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = transformers.Wav2Vec2ForCTC(config).eval()

        def forward(self, x: Any) -> Any:
            return self.model(input_values=x).logits

    return Logits().eval()


def test_a_wav2vec2s_int8_model_loads_in_onnx_runtime_at_its_default_optimizations(tmp_path: Path) -> None:
    """Before: "AddInitializedOrtValue Attempt to replace the existing tensor" at every optimization level from
    basic (MatMulAddFusion took ``gemm_input_shape``, which the pre-processing's own fusion had saved and
    ConstantSharing had just released), and the int8 variant failed in the quantize stage."""
    recipe = {"name": "wav2vec2", "model": {"inputs": [{"name": "x", "shape": [1, 4000], "dtype": "float32"}]},
              "data": {"calib": {"reader": "random", "samples": 2}},
              "variants": {"int8": ["simplify", {"quantize": {"runtime": "ort", "calibration": {"data": "calib"}}}]},
              "targets": ["ort:cpu"], "benchmark": {"enabled": False}}
    result = qdeploy.run(recipe, model=tiny_wav2vec2(), out=tmp_path / "run")
    assert result.exit_code == 0, result.report.get("failures")
    session = ort.InferenceSession(str(result.artifacts["int8"].path), providers=["CPUExecutionProvider"])
    assert session.get_inputs()[0].name == "x"
