"""Budget mode: the fewest nodes kept in float32, chosen by measured sensitivity, one model for all trials."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper

from qdeploy.stages import fp16
from qdeploy.stages.fp16 import _budget as fp16_budget
from tests.helpers.fp16 import (
    const,
    make_model,
    offset_budget_model,
    offset_budget_samples,
    run_ort,
    run_reference,
    run_stage,
    tensor,
)

BENIGN = ["tanh", "scale", "relu", "sigmoid", "mix"]


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    return float(np.dot(a, b) / (np.linalg.norm(a) * np.linalg.norm(b)))


def test_budget_keeps_only_the_sensitive_nodes_whatever_their_graph_position(tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    built, conversions = [], []
    real_twin, real_convert = fp16_budget.gated_twin, fp16.convert
    monkeypatch.setattr(fp16_budget, "gated_twin", lambda *a, **k: built.append(1) or real_twin(*a, **k))
    monkeypatch.setattr(fp16, "convert", lambda *a, **k: conversions.append(1) or real_convert(*a, **k))
    model = offset_budget_model()
    result = run_stage(tmp_path, model, {"val": offset_budget_samples(6)}, mode="auto", calibration={"data": "val"},
                       tolerance={"cosine_min": 0.9999})

    budget = result.findings.budget
    assert budget["met"] is True
    assert budget["metrics_all_float16"]["cosine"] < 0.9999  # plain float16 misses the tolerance
    chosen = [name for group in budget["float32_nodes"] for name in group["nodes"]]
    assert sorted(chosen) == ["shift_down", "shift_up"]
    assert all(group["sensitivity"] > 0.01 for group in budget["float32_nodes"])
    assert budget["trials"] > budget["groups"]  # one sensitivity trial per group, plus the search
    assert len(built) == 1 and len(conversions) == 1  # every trial reused one gated model; one conversion
    kept = {entry["node"]: entry["reason"] for entry in result.findings.kept_in_fp32}
    assert kept == {"shift_up": "budget: sensitivity", "shift_down": "budget: sensitivity"}
    assert not set(BENIGN) & set(kept)

    x = offset_budget_samples(7)[-1]
    expected = run_ort(model, x)[0]
    assert _cosine(run_reference(result.model, x)[0], expected) >= 0.9999  # true float16 arithmetic
    assert result.findings.fidelity["emulated"]["passed"]


def test_budget_blocks_nothing_when_float16_already_meets_the_tolerance(tmp_path: Path) -> None:
    result = run_stage(tmp_path, offset_budget_model(), {"val": offset_budget_samples(3)}, mode="auto",
                       calibration={"data": "val"}, tolerance={"cosine_min": 0.5})
    assert result.findings.budget["float32_nodes"] == []
    assert result.findings.budget["trials"] == 1
    assert result.findings.kept_in_fp32 == []


def test_data_movement_nodes_share_their_producers_group() -> None:
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"),
             helper.make_node("Reshape", ["r", "shape"], ["rs"], name="reshape"),
             helper.make_node("Transpose", ["rs"], ["t"], name="transpose", perm=[1, 0]),
             helper.make_node("Exp", ["t"], ["y"], name="exp")]
    model = make_model(nodes, [const("shape", [2, 2], np.int64)], [tensor("x", [4])], [tensor("y", [2, 2])])
    model = onnx.shape_inference.infer_shapes(model)
    from qdeploy.stages.fp16._types import all_types

    groups = fp16_budget.node_groups(model, set(), all_types(model))
    assert groups == [["relu", "reshape", "transpose"], ["exp"]]
    assert fp16_budget.node_groups(model, {"relu"}, all_types(model)) == [["reshape", "transpose"], ["exp"]]


def test_a_long_search_is_announced_with_its_estimate_and_how_to_avoid_it(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch,
                                                                          caplog: pytest.LogCaptureFixture) -> None:
    """LEADER's fingerprint network ran its repair search for an hour without a word (683 groups, 1.5 s a trial)."""
    monkeypatch.setattr(fp16_budget, "LONG_SEARCH_SECONDS", 0.0)
    with caplog.at_level("INFO", logger="qdeploy.stages.fp16._budget"):
        result = run_stage(tmp_path, offset_budget_model(), {"val": offset_budget_samples(3)}, mode="auto",
                           calibration={"data": "val"}, tolerance={"cosine_min": 0.9999})
    warnings = [record.getMessage() for record in caplog.records if record.levelname == "WARNING"]
    groups = result.findings.budget["groups"]
    assert any(message.startswith(f"fp16 budget: {groups} node groups, one trial each at ") and "repair: false"
               in message for message in warnings), warnings
