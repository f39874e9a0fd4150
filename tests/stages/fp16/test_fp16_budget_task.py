"""The fp16 budget on the user's own task metric (``tolerance: {metric, max_drop}``, mode 'auto'): a head whose
two classes differ by less than float16 can tell apart keeps float32, though output similarity passes."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from onnx import helper
from pydantic import ValidationError

from qdeploy.core.errors import DataError
from qdeploy.stages import fp16
from qdeploy.stages.fp16 import Fp16Config
from tests.helpers.fp16 import artifact, const, context, make_model, run_ort, tensor
from tests.helpers.task_budget import ACCURACY

TOLERANCE = {"metric": "metrics.py:accuracy", "max_drop": 0.01}


def tied_head() -> Any:
    """x -> scale -> head (MatMul): class 1's weights are class 0's times 1 + 2e-4, which rounds away in
    float16: both logits tie there and argmax says class 0 for every row."""
    weights = np.array([0.5, 0.25, 1.0, 0.75], dtype=np.float32)
    head = np.stack([weights, weights * np.float32(1 + 2e-4)], axis=1)
    nodes = [helper.make_node("Mul", ["x", "one"], ["scaled"], name="scale"),
             helper.make_node("MatMul", ["scaled", "w"], ["logits"], name="head")]
    return make_model(nodes, [const("one", np.float32(1.0)), const("w", head)], [tensor("x", ["n", 4])],
                      [tensor("logits", ["n", 2])])


def labelled(model: Any, count: int, seed: int) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    samples = []
    for _ in range(count):
        x = rng.standard_normal((8, 4)).astype(np.float32)
        samples.append({"x": x, "label": run_ort(model, {"x": x})[0].argmax(-1)})  # float32 is right
    return samples


def accuracy(model: Any, samples: list[dict[str, np.ndarray]]) -> float:
    return float(np.mean([(run_ort(model, {"x": s["x"]})[0].argmax(-1) == s["label"]).mean() for s in samples]))


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Any, Any, Path]:
    folder = tmp_path_factory.mktemp("fp16_task")
    (folder / "metrics.py").write_text(ACCURACY)
    model = tied_head()
    ctx = dataclasses.replace(context(folder, {"val": labelled(model, 6, 0)}), targets=("ort:cpu",))
    config = Fp16Config(mode="auto", calibration={"data": "val"}, tolerance=TOLERANCE)
    by_metric = fp16.run(artifact(folder, model), config, ctx)
    by_outputs = fp16.run(artifact(folder, model, "plain.onnx"), Fp16Config(mode="auto", calibration={"data": "val"}),
                          ctx)
    return model, by_metric, by_outputs, folder


def test_the_budget_holds_the_task_metric_where_output_similarity_does_not(built: tuple) -> None:
    model, by_metric, by_outputs, _ = built
    unseen = labelled(model, 4, 1)
    assert accuracy(model, unseen) == 1.0
    assert by_outputs.findings.budget["met"] and by_outputs.findings.budget["float32_nodes"] == []
    assert accuracy(by_outputs.model, unseen) < 0.8  # cosine passes, the classes are lost
    budget = by_metric.findings.budget
    assert budget["tolerance"] == TOLERANCE and budget["met"] is True
    assert budget["task_metric_all_float16"]["drop"] > 0.2 and budget["task_metric_chosen"]["passed"]
    assert [name for group in budget["float32_nodes"] for name in group["nodes"]] == ["head"]
    assert 1.0 - accuracy(by_metric.model, unseen) <= TOLERANCE["max_drop"]
    target = budget["targets"]["ort:cpu"]
    assert target["status"] == "confirmed" and target["drop"] == 0.0 and target["reference_metric"] == 1.0


def test_a_task_metric_is_budget_mode_only_and_needs_labels(built: tuple, tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="set mode: auto"):
        Fp16Config(calibration={"data": "val"}, tolerance=TOLERANCE)
    model = built[0]
    samples = [{"x": s["x"]} for s in labelled(model, 2, 2)]
    (tmp_path / "metrics.py").write_text(ACCURACY)
    with pytest.raises(DataError, match=r"fp16\.tolerance\.metric: .*has none: give its \.npz samples a 'label'"):
        fp16.run(artifact(tmp_path, model), Fp16Config(mode="auto", calibration={"data": "val"}, tolerance=TOLERANCE),
                 context(tmp_path, {"val": samples}))
