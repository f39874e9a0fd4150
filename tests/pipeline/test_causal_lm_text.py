"""A model.causal_lm checkpoint and a text dataset that names no tokenizer: the run reads the text with the
checkpoint's own tokenizer, and report.json holds the perplexities of the reference and of the variant."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from qdeploy.api import run
from tests.helpers.models import write_recipe
from tests.stages.export.causal_lm_models import WORDS, tiny_llama

pytestmark = pytest.mark.torch
pytest.importorskip("transformers")

RECIPE = """
    name: tiny-lm-text
    model: {causal_lm: {path: tiny-llama}}
    data:
      held: {reader: text, path: corpus.txt, window: 8, samples: 3}
    variants:
      fp32: [simplify]
    targets: [ort:cpu]
    validate: {data: held, metric: perplexity}
    benchmark: {enabled: false}
    report: {formats: [json]}
    """


def test_text_data_reads_with_the_checkpoints_tokenizer(tmp_path: Path) -> None:
    tiny_llama(tmp_path / "tiny-llama", layers=1)  # saves its word-level tokenizer beside the weights
    (tmp_path / "corpus.txt").write_text(" ".join(WORDS * 4), encoding="utf-8")  # ~100 tokens: 12 windows of 8
    result = run(write_recipe(tmp_path, RECIPE), out=tmp_path / "run")
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    assert result.exit_code == 0, (report.get("failures"), report.get("validation"))
    row = next(row for row in report["validation"] if row["variant"] == "fp32")
    assert row["status"] == "passed", row
    assert row["task_metric_name"] == "perplexity" and row["task_metric_direction"] == "lower"
    assert row["task_metric_reference"] > 1.0 and row["metrics"]["task_metric"] > 1.0
    assert row["metrics"]["task_metric"] == pytest.approx(row["task_metric_reference"], rel=1e-4)
