"""A stage's settings declare what the pipeline needs of them (``qdeploy.core.stage_config``): the output limits
an artifact was built to, a task-metric budget, whether it builds per runtime, whether it quantizes at run time.
The defaults say none; the stages with such settings say so."""

from __future__ import annotations

import pytest

from qdeploy.core.stage_config import StageConfig, TaskBudget, variant_tolerance
from qdeploy.core.tolerance import TaskTolerance, Tolerance
from qdeploy.stages.benchmark.config import BenchmarkConfig
from qdeploy.stages.export.config import ExportConfig
from qdeploy.stages.fp16.config import Fp16Config
from qdeploy.stages.quantize.config import QuantizeConfig
from qdeploy.stages.simplify.config import SimplifyConfig
from qdeploy.stages.validate.config import ValidateConfig

TASK = {"metric": "m.py:accuracy", "max_drop": 0.01}


@pytest.mark.parametrize("config", [
    SimplifyConfig(), Fp16Config(), ValidateConfig(), BenchmarkConfig(), ExportConfig(onnx="m.onnx"),
    *(QuantizeConfig.model_validate({"mode": mode}) for mode in ("lower", "weight_only")),
    QuantizeConfig.model_validate({"engine": "nncf"}),
])
def test_settings_without_budget_or_split_declare_none(config: StageConfig) -> None:
    assert isinstance(config, StageConfig)
    assert config.declared_tolerance() is None and config.task_budget() is None
    assert config.per_runtime_build() == "never" and not config.quantizes_at_run_time()
    assert config.with_task_metric("m.py:other") is config
    with pytest.raises(TypeError, match="one graph for every runtime"):
        config.for_runtime("openvino")


@pytest.mark.parametrize("settings", [{}, {"mode": "dynamic"}])
def test_quantize_declares_its_budget_by_its_shape(settings: dict) -> None:
    limits = QuantizeConfig.model_validate({**settings, "tolerance": {"cosine_min": 0.99}})
    assert limits.declared_tolerance() == Tolerance(cosine_min=0.99) and limits.task_budget() is None
    task = QuantizeConfig.model_validate({**settings, "tolerance": TASK, "budget": {"data": "held", "samples": 5}})
    assert task.declared_tolerance() is None  # a task metric holds no output limits: validation's own apply
    assert task.task_budget() == TaskBudget(TaskTolerance(**TASK), "held", 5)
    assert task.with_task_metric("m.py:other") is task  # the budget names its own metric
    unnamed = QuantizeConfig.model_validate({**settings, "tolerance": {"max_drop": 0.01}})
    named = unnamed.with_task_metric("m.py:accuracy")
    assert unnamed.task_budget().metric is None and named.task_budget().metric == "m.py:accuracy"
    assert named.model_dump(exclude={"tolerance"}) == unnamed.model_dump(exclude={"tolerance"})


def test_a_ptq_budget_measures_on_its_calibration_data_when_it_names_none() -> None:
    config = QuantizeConfig.model_validate({"tolerance": TASK, "calibration": {"data": "cal"}})
    assert config.task_budget().data == "cal"


def test_only_dynamic_quantizes_at_run_time() -> None:
    assert QuantizeConfig.model_validate({"mode": "dynamic"}).quantizes_at_run_time()
    assert not QuantizeConfig.model_validate({}).quantizes_at_run_time()


@pytest.mark.parametrize(("settings", "build"), [
    ({}, "auto"), ({"per_runtime": True}, "always"), ({"per_runtime": False}, "never"),
    ({"runtime": "openvino"}, "never"),  # auto, but the graph is pinned to one runtime
])
def test_ptq_declares_how_it_builds_per_runtime(settings: dict, build: str) -> None:
    config = QuantizeConfig.model_validate(settings)
    assert config.per_runtime_build() == build
    if build != "never":
        specialised = config.for_runtime("openvino")
        assert specialised.runtime == "openvino" and specialised.per_runtime_build() == "never"


def test_fp16_declares_its_limits_or_its_task_budget() -> None:
    assert Fp16Config(tolerance={"snr_db_min": 40}).declared_tolerance() == Tolerance(snr_db_min=40)
    task = Fp16Config(mode="auto", calibration={"data": "cal", "samples": 4}, tolerance={"max_relative_drop": 0.1})
    assert task.declared_tolerance() is None
    assert task.task_budget() == TaskBudget(TaskTolerance(max_relative_drop=0.1), "cal", 4)
    assert task.with_task_metric("m.py:accuracy").task_budget().metric == "m.py:accuracy"


def test_a_variant_is_held_to_its_last_output_limits() -> None:
    first, last = Tolerance(cosine_min=0.9), Tolerance(cosine_min=0.5)
    steps = [SimplifyConfig(), Fp16Config(tolerance=first.model_dump()),
             QuantizeConfig.model_validate({"tolerance": last.model_dump()}),
             QuantizeConfig.model_validate({"mode": "dynamic", "tolerance": TASK})]
    assert variant_tolerance(steps[:2]) == first
    assert variant_tolerance(steps) == last  # the task-metric budget after it declares no limits
    assert variant_tolerance([SimplifyConfig()]) is None and variant_tolerance([]) is None
