"""The accuracy budget on the user's own task metric (``tolerance: {metric, max_drop}``) and its time bound
(``budget.max_seconds``)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from pydantic import ValidationError

from qdeploy.stages import quantize
from qdeploy.stages.quantize import CalibrationRef, QuantizeConfig
from tests.helpers.quantize import artifact_at, run_ort, stage_context
from tests.helpers.task_budget import digits_classifier

MAX_DROP = 0.02


@pytest.fixture(scope="module")
def digits(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, np.ndarray, np.ndarray]:
    return digits_classifier(tmp_path_factory.mktemp("digits"))


def accuracy(model: Any, inputs: np.ndarray, labels: np.ndarray) -> float:
    return float((run_ort(model, {"x": inputs})[0].argmax(-1) == labels).mean())


def config(**budget: Any) -> QuantizeConfig:
    return QuantizeConfig(calibration=CalibrationRef(data="budget", samples=16), verify_targets=[],
                          tolerance={"metric": "metrics.py:accuracy", "max_drop": MAX_DROP},
                          budget={"samples": 16, **budget})


def test_int8_holds_the_task_metric_drop_on_held_out_digits(tmp_path: Path, digits: tuple) -> None:
    model, data, inputs, labels = digits
    context = stage_context(model.parent, {"budget": data})
    result = quantize.run(artifact_at(model), config(), dataclasses.replace(context, targets=("ort:cpu",)))
    budget = result.report()["budget"]
    assert budget["met"] is True and budget["tolerance"] == {"metric": "metrics.py:accuracy", "max_drop": MAX_DROP}
    for part in ("search", "held_back"):  # plain int8 breaks the task
        assert budget["initial"][part]["drop"] > 0.1 and budget["initial"][part]["reference_metric"] > 0.9
    for part in ("search", "held_back"):  # the reference metric and the final drop, on both parts
        final = budget["final"][part]
        assert final["passed"] and final["drop"] <= MAX_DROP and final["reference_metric"] > 0.9
    trials = [trial for trial in budget["tried"] if "task_metric" in trial]
    assert trials and all(0.0 <= trial["task_metric"] <= 1.0 for trial in trials)
    assert budget["ranking"] == "local error (one run)"  # ranks cheaply, decides with the metric
    assert "task metric drop" in budget["confirmed"] and budget["targets"]["ort:cpu"]["status"] == "confirmed"
    assert "ort:cpu: confirmed (task metric drop" in budget["confirmed"]
    assert {"fully quantized", "ranking", "prefix"} <= set(budget["cost"])
    reference = accuracy(model, inputs, labels)  # on 541 digits the search never saw
    assert reference - accuracy(result.model, inputs, labels) <= MAX_DROP


def test_max_seconds_stops_the_search_and_says_so(tmp_path: Path, digits: tuple) -> None:
    model, data, _, _ = digits
    result = quantize.run(artifact_at(model), config(max_seconds=1e-6), stage_context(model.parent,
                                                                                       {"budget": data}))
    budget = result.report()["budget"]
    assert budget["stopped"].startswith("budget.max_seconds (1e-06 s) reached")
    assert budget["max_seconds"] == 1e-6 and budget["met"] is False
    assert "best model found so far" in budget["note"] and budget["kept_float"] == []
    assert budget["cost"]["fully quantized"]["evaluations"] == 1


@pytest.mark.parametrize(("tolerance", "message"), [
    ({"metric": "metrics.py:accuracy"}, "exactly one of max_drop or max_relative_drop"),
    ({"metric": "metrics.py:accuracy", "max_drop": 0.01, "max_relative_drop": 0.01}, "exactly one"),
    ({"metric": "accuracy", "max_drop": 0.01}, "'file.py:function'"),
])
def test_a_task_tolerance_names_a_function_and_one_limit(tolerance: dict, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        QuantizeConfig(tolerance=tolerance)
