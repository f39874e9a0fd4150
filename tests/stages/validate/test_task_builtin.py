"""Built-in task metrics: perplexity's direction in the budget's comparison and in validate's config."""

from __future__ import annotations

import numpy as np
import pytest
from pydantic import ValidationError

from qdeploy.core.lm_metrics import BUILTIN_METRICS
from qdeploy.core.tolerance import TaskTolerance
from qdeploy.stages.task_metric import MetricComparison, TaskJudge
from qdeploy.stages.validate import ValidateConfig, evaluate, load_metric

LABELS = [np.array([[0, 1, 2, 3]]), np.array([[3, 2, 1, 0]])]


def _outputs(sharpness: float) -> list[dict[str, np.ndarray]]:
    """Logits that put ``sharpness`` on each next label: higher is a lower perplexity."""
    outputs = []
    for label in LABELS:
        logits = np.zeros((1, 4, 5), np.float32)
        for position in range(3):
            logits[0, position, label[0, position + 1]] = sharpness
        outputs.append({"logits": logits})
    return outputs


def _judge(relative: float) -> TaskJudge:
    tolerance = TaskTolerance(metric="perplexity", max_relative_drop=relative)
    return TaskJudge(load_metric("perplexity", lambda path: path), tolerance, LABELS, search_count=2)


def test_a_perplexity_rise_beyond_the_allowed_share_fails() -> None:
    result = _judge(0.05).compare("search", _outputs(2.0), _outputs(1.0))
    assert result.direction == "lower" and result.metric is not None and result.reference is not None
    assert result.metric > result.reference and result.drop == pytest.approx(result.metric - result.reference)
    assert not result.passed and "rose" in result.reasons[0] and "lower is better" in result.reasons[0]


def test_a_perplexity_fall_passes_and_a_small_rise_holds() -> None:
    better = _judge(0.05).compare("search", _outputs(1.0), _outputs(2.0))
    assert better.passed and better.drop is not None and better.drop < 0 and better.ratio() == 0.0
    slightly = _judge(0.5).compare("search", _outputs(2.0), _outputs(1.9))
    assert slightly.passed and 0.0 < slightly.ratio() <= 1.0


def test_a_higher_is_better_metric_keeps_its_drop() -> None:
    comparison = MetricComparison([], True, [], metric=0.8, reference=0.9)
    assert comparison.drop == pytest.approx(0.1)
    lowered = MetricComparison([], True, [], metric=12.0, reference=10.0, direction="lower")
    assert lowered.drop == pytest.approx(2.0)


def test_validate_names_a_builtin_metric_without_a_file() -> None:
    assert ValidateConfig(metric="perplexity").metric == "perplexity"
    with pytest.raises(ValidationError, match="built-in metric"):
        ValidateConfig(metric="accuracy")
    value, why = evaluate(BUILTIN_METRICS["perplexity"], "perplexity", _outputs(0.0), LABELS)
    assert why == "" and value == pytest.approx(5.0)
    missing, why = evaluate(BUILTIN_METRICS["perplexity"], "perplexity", _outputs(0.0), None)
    assert missing is None and "needs token-id labels" in why
