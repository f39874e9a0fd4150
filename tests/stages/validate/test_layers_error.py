"""Each node's output against the float32 reference's same tensor (issue 31): an fp16 overflow stands out where it
is born, and exposing the tensors is checked against the shipped graph's outputs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

from qdeploy.stages.validate._layers_error import layer_errors
from tests.helpers.layers import overflow_chain, unfusable_qdq_conv

FEEDS = [{"input": np.random.default_rng(seed).random((1, 64), dtype=np.float32)} for seed in range(2)]


@pytest.fixture(scope="module")
def chain(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("overflow")
    onnx.save(overflow_chain(fp16=False), folder / "fp32.onnx")
    onnx.save(overflow_chain(fp16=True), folder / "fp16.onnx")
    return folder / "fp32.onnx", folder / "fp16.onnx"


@pytest.mark.parametrize("target", ["reference:cpu", "ort:cpu"])
def test_the_layer_that_overflows_fp16_stands_out(chain: tuple[Path, Path], target: str) -> None:
    errors = layer_errors(*chain, target, FEEDS, pin_f32=False)
    assert errors.per_node["scale"]["nonfinite"] == 0 and errors.per_node["scale"]["snr_db"] > 50
    assert errors.per_node["big"]["nonfinite"] > 0  # x*300*300 > 65504: Inf where the reference is finite
    assert errors.shapes["big"] == [1, 64] and errors.samples == 2
    assert errors.exposure["changed"] is False


def test_int8_conv_error_is_measured_per_node(tmp_path: Path) -> None:
    reference, candidate = unfusable_qdq_conv()
    onnx.save(reference, tmp_path / "ref.onnx")
    onnx.save(candidate, tmp_path / "q.onnx")
    feeds = [{"input": np.random.default_rng(0).random((1, 3, 16, 16), dtype=np.float32)}]
    errors = layer_errors(tmp_path / "ref.onnx", tmp_path / "q.onnx", "ort:cpu", feeds, pin_f32=False)
    conv = errors.per_node["conv"]
    assert conv["tensor"] == "out" and 20 < conv["snr_db"] < 80 and conv["cosine"] > 0.999


def test_tensor_metrics_agree_with_compare_outputs() -> None:
    from qdeploy.core.compare import compare_outputs
    from qdeploy.core.tolerance import Tolerance
    from qdeploy.stages.validate._layers_error import tensor_metrics

    rng = np.random.default_rng(3)
    refs = [rng.standard_normal((2, 50)).astype(np.float32) for _ in range(3)]
    cands = [r + rng.standard_normal(r.shape).astype(np.float32) * 0.01 for r in refs]
    ours = tensor_metrics(refs, cands)
    theirs = compare_outputs([{"t": r} for r in refs], [{"t": c} for c in cands], Tolerance()).outputs[0]
    assert ours["snr_db"] == pytest.approx(theirs.snr_db, abs=1e-6)
    assert ours["cosine"] == pytest.approx(theirs.cosine, abs=1e-9)
    assert ours["max_abs_err"] == pytest.approx(theirs.max_abs_err, rel=1e-6)
    assert tensor_metrics(refs, refs)["snr_db"] == 200.0
