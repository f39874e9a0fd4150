"""Simplify's equivalence check against the original's own float noise, and folding as ONNX Runtime folds.

A model whose outputs move between ONNX Runtime's optimisation levels by more than ``check_atol`` (a long
recurrence) is simplified; a simplification that is wrong still fails, naming the config field; Conv +
BatchNormalization folded by simplify runs bit for bit as ONNX Runtime runs the original (which fuses it at load).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from qdeploy.core.context import StageContext
from qdeploy.core.errors import StageError
from qdeploy.graph import rewrite_rules
from qdeploy.stages.simplify._noise import noise_floor
from tests.control_flow_models import chaotic_recurrence_model
from tests.helpers.simplify import simplify_model


def _ort(model: onnx.ModelProto, feeds: dict[str, np.ndarray], level: str = "ORT_ENABLE_ALL") -> list[np.ndarray]:
    options = ort.SessionOptions()
    options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, level)
    options.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"]).run(None, feeds)


def _sample(seed: int) -> dict[str, np.ndarray]:
    return {"x": np.random.default_rng(seed).standard_normal((1, 32)).astype(np.float32)}


def test_the_recurrence_is_noisier_than_the_default_atol(tmp_path: Path) -> None:
    """The premise: the model's own outputs move between ORT's optimisation levels by more than 1e-4."""
    model = chaotic_recurrence_model()
    onnx.save(model, tmp_path / "m.onnx")
    runs = [(feeds, {"y": _ort(model, feeds)[0]}) for feeds in map(_sample, range(3))]
    floor = noise_floor(tmp_path / "m.onnx", runs)
    assert set(floor) == {"y"} and floor["y"] > 1e-4


def test_a_model_noisier_than_check_atol_simplifies_within_its_noise_floor(tmp_path: Path,
                                                                           ctx: StageContext) -> None:
    """Before: 'simplified model disagrees with the original on check sample 1 ... beyond atol 0.0001'."""
    model = chaotic_recurrence_model()
    result = simplify_model(model, tmp_path, ctx)
    assert "Div" not in [node.op_type for node in result.model.graph.node]  # Conv+Div fused: rounds differently
    check = result.findings.check
    noise = check.noise_floor
    assert noise.measured and noise.levels == "ORT_DISABLE_ALL vs ORT_ENABLE_ALL"
    assert noise.per_output["y"] > 1e-4 and noise.factor == 10.0
    assert noise.atol_used["y"] == pytest.approx(10.0 * noise.per_output["y"])
    assert 1e-4 < check.max_abs_err <= noise.atol_used["y"] and check.atol == 1e-4


def test_a_check_within_atol_does_not_measure_the_noise_floor(tmp_path: Path, ctx: StageContext) -> None:
    result = simplify_model(chaotic_recurrence_model(steps=3), tmp_path, ctx)
    assert result.findings.check.noise_floor.model_dump() == {"measured": False,
                                                    "why": "every output within check_atol and check_rtol"}


def _perturbed(original: Any) -> Any:
    def fused_conv(edit: Any, conv: Any, after: Any, new_weight: np.ndarray, new_bias: np.ndarray) -> Any:
        return original(edit, conv, after, new_weight + np.float32(0.5), new_bias)  # a wrong fusion
    return fused_conv


def test_a_wrong_simplification_still_fails_and_names_the_config_field(tmp_path: Path, ctx: StageContext,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rewrite_rules, "_fused_conv", _perturbed(rewrite_rules._fused_conv))
    with pytest.raises(StageError) as raised:
        simplify_model(chaotic_recurrence_model(), tmp_path, ctx)
    message = str(raised.value)
    assert "simplified model disagrees with the original on check sample" in message
    assert "noise floor on 'y'" in message and "ORT_DISABLE_ALL" in message
    assert "simplify.check_atol" in message and "simplify.check_noise_factor" in message


def test_without_a_noise_factor_the_configured_atol_stands_and_is_named(tmp_path: Path, ctx: StageContext) -> None:
    with pytest.raises(StageError, match=r"beyond atol 0\.0001.*check_noise_factor is 0.*simplify\.check_atol"):
        simplify_model(chaotic_recurrence_model(), tmp_path, ctx, check_noise_factor=0)


def _conv_bn(bias: bool) -> onnx.ModelProto:
    rng = np.random.default_rng(3)
    arrays = {"w": rng.standard_normal((16, 8, 3, 3)), "scale": rng.standard_normal(16) * 3 + 1,
              "beta": rng.standard_normal(16), "mean": rng.standard_normal(16),
              "var": np.abs(rng.standard_normal(16)) * 0.1 + 1e-3, **({"b": rng.standard_normal(16)} if bias else {})}
    inits = [numpy_helper.from_array(value.astype(np.float32), name) for name, value in arrays.items()]
    nodes = [helper.make_node("Conv", ["x", "w", "b"] if bias else ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c", "scale", "beta", "mean", "var"], ["y"], epsilon=1e-5)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 12, 12])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, 12, 12])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


@pytest.mark.parametrize("bias", [False, True])
def test_conv_batchnorm_folded_runs_bit_identical_to_the_original_on_ort(tmp_path: Path, ctx: StageContext,
                                                                         bias: bool) -> None:
    """ONNX Runtime fuses Conv+BatchNormalization when it loads the original; simplify's fold rounds the same way.
    Before: the fold computed in float64 and differed by 2e-5..4e-5."""
    model = _conv_bn(bias)
    result = simplify_model(model, tmp_path, ctx)
    assert [node.op_type for node in result.model.graph.node] == ["Conv"]
    assert result.findings.check.max_abs_err == 0.0
    for seed in range(3):
        feeds = {"x": np.random.default_rng(seed).standard_normal((1, 8, 12, 12)).astype(np.float32)}
        np.testing.assert_array_equal(_ort(result.model, feeds)[0], _ort(model, feeds)[0])
