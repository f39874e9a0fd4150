"""A causal LM through a whole run on a text dataset: per-token KL and top-1 against the float32 reference, and
perplexity as the built-in task metric, all in report.json."""

from __future__ import annotations

from pathlib import Path

import pytest

from qdeploy.pipeline.recipe.loader import load_recipe_file
from qdeploy.pipeline.run.runner import RunOptions, run_recipe
from tests.helpers.decoder import export
from tests.helpers.models import write_recipe

TEXT = ("The river runs past the old mill and under the stone bridge. Children play by the water while their "
        "parents talk about the weather, the harvest and the market in town. ") * 12

RECIPE = """
    name: lm-text
    model: {onnx: decoder.onnx}
    data:
      calib: {reader: text, path: corpus.txt, window: 16, part: [0.0, 0.5], tokenizer: tokenizer.json}
      held: {reader: text, path: corpus.txt, window: 16, part: [0.5, 1.0], samples: 3, tokenizer: tokenizer.json}
    variants:
      fp32: [simplify]
      int8: [simplify, {quantize: {mode: dynamic}}]
    targets: [ort:cpu]
    validate:
      data: held
      samples: 3
      metric: perplexity
      tolerance: {kl_max: 0.5, cosine_min: 0.5}
    benchmark: {enabled: false}
    report: {formats: [json]}
    """

pytestmark = pytest.mark.slow  # exports a transformers decoder (about 10 s) and runs the recipe


def _tokenizer(folder: Path) -> int:
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = dict.fromkeys(TEXT.replace(".", " .").replace(",", " ,").split())
    tokenizer = Tokenizer(models.WordLevel({"[UNK]": 0, **{word: i + 1 for i, word in enumerate(words)}},
                                           unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.save(str(folder / "tokenizer.json"))
    return tokenizer.get_vocab_size()


def test_text_data_gives_kl_top1_and_perplexities(tmp_path: Path) -> None:
    vocab = _tokenizer(tmp_path)
    (tmp_path / "corpus.txt").write_text(TEXT, encoding="utf-8")
    export(tmp_path / "decoder.onnx", layers=2, hidden=64, vocab=vocab)
    result = run_recipe(load_recipe_file(write_recipe(tmp_path, RECIPE)),
                        RunOptions(out_dir=tmp_path / "run", show_progress=False))
    rows = {row["variant"]: row for row in result.report["validation"]}
    assert {"fp32", "int8"} <= set(rows)
    for name, row in rows.items():
        assert row["status"] == "passed", (name, row["reason"])
        metrics = row["metrics"]
        assert 0.0 <= metrics["kl"] <= 0.5 and 0.0 <= metrics["top1_agreement"] <= 1.0, name
        logits = next(out for out in row["outputs"] if out["name"] == "logits")
        assert logits["kl"] == metrics["kl"] and logits["tolerance"]["kl_max"] == 0.5
        assert row["task_metric_name"] == "perplexity" and row["task_metric_direction"] == "lower"
        assert row["task_metric_reference"] > 1.0 and metrics["task_metric"] > 1.0
    assert rows["fp32"]["metrics"]["kl"] < 1e-6 and rows["fp32"]["metrics"]["top1_agreement"] == 1.0
    assert rows["fp32"]["metrics"]["task_metric"] == pytest.approx(rows["fp32"]["task_metric_reference"], rel=1e-5)
    assert result.exit_code == 0, (result.report.get("failures"), result.report.get("gates"))
