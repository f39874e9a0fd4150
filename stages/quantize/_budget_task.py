"""The accuracy budget on the user's own task metric: its evaluation lives in ``qdeploy.stages.task_metric``,
shared with the fp16 stage's budget; the quantize budget's modules import it from here."""

from __future__ import annotations

from qdeploy.stages.task_metric import MetricComparison, TaskJudge, metric_summary

__all__ = ["MetricComparison", "TaskJudge", "metric_summary"]
