"""Where ptq puts its Q/DQ pairs for each runtime, decided without calibrating (``per_runtime: auto``), and the
calibration the two builds of one variant share."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper

from qdeploy.stages import quantize
from qdeploy.stages.quantize import QuantizeConfig
from qdeploy.stages.quantize.ptq._placement import placement_differences, quantized_placement
from tests.helpers.quantize import init, make_model, save_artifact, stage_context, tiny_conv


def _mlp() -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"], name="mm1"),
             helper.make_node("Relu", ["h"], ["r"], name="relu"),
             helper.make_node("MatMul", ["r", "w2"], ["y"], name="mm2")]
    return make_model(nodes, [init("w1", rng.standard_normal((16, 32))), init("w2", rng.standard_normal((32, 8)))],
                      {"x": [1, 16]}, {"y": [1, 8]})


@pytest.mark.parametrize(("model", "differs_at"), [
    (tiny_conv, {"conv1", "conv2", "relu1", "relu2"}),  # OpenVINO: Q after the Relu, not between Conv and Relu
    (_mlp, set()),  # no convolution, no float tail: one graph serves both
])
def test_the_placement_decision_finds_the_nodes_the_runtimes_quantize_differently(
        tmp_path: Path, model: object, differs_at: set[str]) -> None:
    artifact = save_artifact(tmp_path, model())  # type: ignore[operator]
    found = placement_differences(artifact.path, QuantizeConfig(), tmp_path)
    assert differs_at <= set(found) and bool(found) == bool(differs_at)


def test_the_decision_matches_the_calibrated_builds(tmp_path: Path) -> None:
    """Placeholder ranges place the Q/DQ pairs where calibrated ones do."""
    artifact = save_artifact(tmp_path, tiny_conv())
    built = {runtime: quantize.run(artifact, QuantizeConfig(runtime=runtime, reduce_range="weights"),
                                   stage_context(tmp_path)).model for runtime in ("ort", "openvino")}
    ort, openvino = (quantized_placement(model) for model in built.values())
    assert sorted(name for name in ort.keys() | openvino.keys() if ort.get(name) != openvino.get(name)) \
        == placement_differences(artifact.path, QuantizeConfig(), tmp_path / "decide")


def test_the_two_runtime_builds_of_a_variant_calibrate_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from qdeploy.stages.quantize.ptq import _ptq

    calls = []
    real = _ptq.calibrate
    monkeypatch.setattr(_ptq, "calibrate", lambda *args, **kwargs: calls.append(1) or real(*args, **kwargs))
    artifact = save_artifact(tmp_path, tiny_conv())
    for settings in ({"runtime": "ort"}, {"runtime": "openvino"}):
        quantize.run(artifact, QuantizeConfig(reduce_range="weights", **settings), stage_context(tmp_path))
    assert len(calls) == 1  # the openvino build read the ort build's ranges
    quantize.run(artifact, QuantizeConfig(reduce_range="weights", method="percentile"), stage_context(tmp_path))
    quantize.run(artifact, QuantizeConfig(reduce_range="weights"), stage_context(tmp_path, ranges={"x": (0.0, 1.0)}))
    assert len(calls) == 3  # other settings, other samples: calibrated again
