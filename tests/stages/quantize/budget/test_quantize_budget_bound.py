"""The accuracy budget's cost: a default time bound that scales with the model when the recipe sets no
``budget.max_seconds``, and evaluations that reuse what earlier ones computed (``stages/quantize/budget/_cost.py``,
``accuracy_budget/evaluate.py``, ``stages/task_metric.py``).

Slow machines are simulated: a fake clock that only evaluations advance (each "takes" ``SECONDS_PER_EVALUATION``),
so the search that would take hours there is stopped by the default bound in a second here.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from qdeploy.stages import quantize
from qdeploy.stages import task_metric as task_metric_module
from qdeploy.stages.accuracy_budget import clock as budget_cost
from qdeploy.stages.accuracy_budget import evaluate as budget_eval
from qdeploy.stages.accuracy_budget.evaluate import Evaluator, ort_runner
from qdeploy.stages.accuracy_budget.targets import TargetPlan
from qdeploy.stages.quantize import CalibrationRef, QuantizeConfig
from tests.helpers.budget import binarizing_detector, confident_samples
from tests.helpers.quantize import artifact_at, save_artifact, stage_context
from tests.helpers.task_budget import digits_classifier

SECONDS_PER_EVALUATION = 100.0
"""What one evaluation "takes" on the simulated machine: the default bound is then its ceiling, 1800 s."""


class _SlowMachine:
    """A clock that evaluations alone advance, by ``SECONDS_PER_EVALUATION`` each."""

    def __init__(self) -> None:
        self.now = 0.0
        self.evaluations = 0

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        measure = Evaluator.measure

        def slow(evaluator: Evaluator, *args: Any, **kwargs: Any) -> Any:
            self.now += SECONDS_PER_EVALUATION
            self.evaluations += 1
            return measure(evaluator, *args, **kwargs)

        monkeypatch.setattr(budget_cost, "now", lambda: self.now)
        monkeypatch.setattr(Evaluator, "measure", slow)


def _detector_run(tmp_path: Path, **budget: Any) -> dict[str, Any]:
    model = binarizing_detector()  # the search there takes 77 evaluations (test_quantize_budget.py)
    samples = confident_samples(model, 24)
    folders = {}
    for name, group in (("calib", samples[:8]), ("budget", samples[8:])):
        folders[name] = tmp_path / name
        folders[name].mkdir()
        for index, x in enumerate(group):
            np.save(folders[name] / f"{index:02d}.npy", x)
    config = QuantizeConfig(calibration={"data": "calib", "samples": 8}, reduce_range="weights",
                            tolerance={"cosine_min": 0.995}, budget={"data": "budget", "samples": 16, **budget},
                            verify_targets=[])
    result = quantize.run(save_artifact(tmp_path, model), config, stage_context(tmp_path, folders))
    return result.report()["budget"]


def test_a_budget_without_max_seconds_stops_at_its_default_bound_and_says_so(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every evaluation takes 100 s: 60 of them would be 6000 s, above the 1800 s ceiling, so the search stops
    after about 18 evaluations with the best model measured, and the findings say which bound stopped it."""
    machine = _SlowMachine()
    machine.install(monkeypatch)
    budget = _detector_run(tmp_path)
    assert budget["time_bound"] == {"seconds": 1800.0, "set_by": "default", "first_evaluation_seconds": 100.0,
                                    "rule": budget["time_bound"]["rule"]}
    assert "60 x the first full evaluation's seconds" in budget["time_bound"]["rule"]
    assert budget["stopped"].startswith("the budget's default time bound (1800 s: 60 x the 100 s of its first "
                                        "full evaluation")
    assert "set budget.max_seconds to change it" in budget["stopped"]
    assert budget["note"].startswith(budget["stopped"]) and budget.get("max_seconds") is None
    # no evaluation starts past the bound: then the held-back check of what it has, and nothing more
    assert machine.evaluations <= 1800 / SECONDS_PER_EVALUATION + 3


def test_max_seconds_overrides_the_default_bound(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _SlowMachine().install(monkeypatch)
    budget = _detector_run(tmp_path, max_seconds=350)
    assert budget["time_bound"]["set_by"] == "budget.max_seconds" and budget["time_bound"]["seconds"] == 350
    assert budget["stopped"].startswith("budget.max_seconds (350 s) reached")


@pytest.fixture(scope="module")
def digits(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, np.ndarray, np.ndarray]:
    return digits_classifier(tmp_path_factory.mktemp("digits"))


def test_the_reference_is_computed_once_and_each_candidate_scored_once(
        tmp_path: Path, digits: tuple, monkeypatch: pytest.MonkeyPatch) -> None:
    """Across every trial and both targets: one float32 run on the budget data, and the metric once on it (per
    part) and once per candidate's outputs, however often the search compares that candidate."""
    model, data, _, _ = digits
    float_runs: list[str] = []
    scored: list[Any] = []

    def counting_runner(path: Path, batches: list) -> Any:
        float_runs.append(str(path))
        return ort_runner(path, batches)

    def counting_evaluate(function: Any, spec: str, outputs: list, labels: Any, **kwargs: Any) -> Any:
        scored.append(outputs)  # kept: no id is reused while the test looks
        return evaluate(function, spec, outputs, labels, **kwargs)

    evaluate = task_metric_module.evaluate
    monkeypatch.setattr(budget_eval, "ort_runner", counting_runner)  # what Evaluator runs the reference with
    monkeypatch.setattr(task_metric_module, "evaluate", counting_evaluate)
    plans = [TargetPlan("ort:cpu", ort_runner), TargetPlan("other:cpu", ort_runner)]
    monkeypatch.setattr("qdeploy.stages.accuracy_budget.targets.plan_targets", lambda targets, runtime: plans)
    config = QuantizeConfig(calibration=CalibrationRef(data="budget", samples=16), verify_targets=[],
                            tolerance={"metric": "metrics.py:accuracy", "max_drop": 0.02}, budget={"samples": 16})
    context = dataclasses.replace(stage_context(model.parent, {"budget": data}), targets=("ort:cpu", "other:cpu"))
    budget = quantize.run(artifact_at(model), config, context).report()["budget"]
    assert budget["evaluations"] >= 3 and budget["tried"]
    assert len(float_runs) == 1, float_runs  # the float32 reference on the budget data, for every trial
    assert len({id(outputs) for outputs in scored}) == len(scored), "a candidate's metric was computed again"
