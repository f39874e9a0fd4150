"""Recurrent nodes (LSTM, GRU, RNN) read their inputs float in every ptq build.

No quantizer here runs them in int8, so a DequantizeLinear in front of one only rounds; and OpenVINO 2026.4's CPU
plugin crashed (SIGSEGV in ``compile_model``, in qdeploy's own process: the whole run died) on the ONNX Runtime
placement of PyThaiNLP's thai2rom attention decoder, whose LSTM read a dequantized Concat of the attention context
and the character embedding.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper

from qdeploy.stages import quantize
from qdeploy.stages.quantize import CalibrationRef, QuantizeConfig
from tests.helpers.quantize import artifact_at, init, make_model, save_artifact, stage_context
from tests.real_models import (
    THAI_TITLES,
    TRANSLITERATOR_DECODER,
    TRANSLITERATOR_ENCODER,
    TRANSLITERATOR_VOCABULARY,
    real_model,
)
from tests.real_recipes.data import transliterator_decoder_feeds

HIDDEN, FEATURES = 16, 16


def _joined_lstm() -> onnx.ModelProto:
    """x, y [1, 5, 8] -> Concat -> Transpose (time first) -> LSTM -> its last state -> MatMul."""
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("Concat", ["x", "y"], ["xy"], name="join", axis=2),
             helper.make_node("Transpose", ["xy"], ["seq"], name="to_seq", perm=[1, 0, 2]),
             helper.make_node("LSTM", ["seq", "W", "R", "B"], ["Y", "Y_h"], name="lstm", hidden_size=HIDDEN),
             helper.make_node("Squeeze", ["Y_h", "axis0"], ["h"], name="squeeze"),
             helper.make_node("MatMul", ["h", "w_out"], ["out"], name="head")]
    inits = [init("W", rng.standard_normal((1, 4 * HIDDEN, FEATURES)) * 0.3),
             init("R", rng.standard_normal((1, 4 * HIDDEN, HIDDEN)) * 0.3), init("B", np.zeros((1, 8 * HIDDEN))),
             init("axis0", [0], np.int64), init("w_out", rng.standard_normal((HIDDEN, 4)))]
    return make_model(nodes, inits, {"x": [1, 5, 8], "y": [1, 5, 8]}, {"out": [1, 4]}, opset=13)


def _quantized(tmp_path: Path, source: Path, samples: list[dict[str, np.ndarray]],
               runtime: str | None = None) -> onnx.ModelProto:
    folder = tmp_path / "calib"
    folder.mkdir(exist_ok=True)
    for index, sample in enumerate(samples):
        np.savez(folder / f"s{index:02d}.npz", **sample)
    config = QuantizeConfig(calibration=CalibrationRef(data="calib"), verify_targets=[], runtime=runtime)
    return quantize.run(artifact_at(source), config, stage_context(tmp_path, {"calib": folder})).model


def _dequantized_readers(model: onnx.ModelProto, op_type: str) -> list[str]:
    dequantized = {node.output[0] for node in model.graph.node if node.op_type == "DequantizeLinear"}
    return [node.name for node in model.graph.node
            if node.op_type == op_type and any(name in dequantized for name in node.input)]


@pytest.mark.parametrize("runtime", [None, "openvino"])
def test_an_lstm_reads_its_inputs_float(tmp_path: Path, runtime: str | None) -> None:
    rng = np.random.default_rng(1)
    samples = [{name: rng.standard_normal((1, 5, 8)).astype(np.float32) for name in "xy"} for _ in range(4)]
    model = _quantized(tmp_path, save_artifact(tmp_path, _joined_lstm()).path, samples, runtime)
    assert _dequantized_readers(model, "LSTM") == []
    assert _dequantized_readers(model, "MatMul") == ["head"]  # the rest stays int8


@pytest.mark.slow
def test_the_transliterators_decoder_int8_compiles_on_openvino(tmp_path: Path) -> None:
    """ONNX Runtime's placement (``int8@ort``), compiled by OpenVINO in a child process: it died of SIGSEGV."""
    files = [real_model(name) for name in (TRANSLITERATOR_ENCODER, TRANSLITERATOR_DECODER,
                                           TRANSLITERATOR_VOCABULARY, THAI_TITLES)]
    model = _quantized(tmp_path, files[1], transliterator_decoder_feeds(*files, count=8, seed=1), runtime="ort")
    assert _dequantized_readers(model, "LSTM") == []
    path = tmp_path / "decoder_int8.onnx"
    onnx.save(model, str(path))
    compiled = subprocess.run([sys.executable, "-c", "import openvino as ov, sys; core = ov.Core(); "
                               "core.compile_model(core.read_model(sys.argv[1]), 'CPU')", str(path)],
                              capture_output=True, text=True, timeout=300, check=False)
    assert compiled.returncode == 0, compiled.stderr[-2000:]
