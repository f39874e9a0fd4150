"""A tiny decoder recipe with ``benchmark: {decode: {prompt: 8, tokens: 4}}`` through the runner: report.json's
benchmark rows hold a decode record for every artifact on every target (an fp16 artifact whose cache is float16
included), with its speedup against the reference, and report.md shows the decode table."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from qdeploy.pipeline.recipe.loader import load_recipe_file
from qdeploy.pipeline.run.runner import RunOptions, run_recipe
from tests.helpers.models import write_recipe

RECIPE = """
    name: decode
    model: {onnx: decoder.onnx}
    data:
      prompts: {reader: npy, path: prompts}
    variants:
      fp32: [simplify]
      fp16: [simplify, {fp16: {keep_io_types: false}}]
    targets: [ort:cpu, openvino:cpu]
    validate: {reference: fp32, data: prompts, samples: 2}
    benchmark: {iterations: 2, warmup: 1, rounds: 1, busy_seconds: 0, decode: {prompt: 8, tokens: 4}}
    report: {formats: [json, md]}
    """

pytestmark = pytest.mark.slow  # a whole run: export, two variants, two runtimes (~30 s on two cores)


def test_report_rows_hold_decode_records_for_each_artifact_and_target(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    pytest.importorskip("openvino")
    from tests.helpers.decoder import export, write_prompts

    _, config = export(tmp_path / "decoder.onnx", layers=2, hidden=64, vocab=1000)
    write_prompts(tmp_path / "prompts", config, 2, prompt=8)
    run_recipe(load_recipe_file(write_recipe(tmp_path, RECIPE)),
               RunOptions(out_dir=tmp_path / "run", show_progress=False))
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    rows = {(row["variant"], row["target"]): row for row in report["benchmarks"]}
    # on a CPU whose OpenVINO default is bf16, fp32@default is timed too (and decoded like every row)
    assert set(rows) - {("fp32@default", "openvino:cpu")} == {
        (variant, target) for variant in ("fp32", "fp16") for target in ("ort:cpu", "openvino:cpu")}
    for key, row in rows.items():
        assert row["status"] == "ok", (key, row["reason"])
        decode = row["decode"]
        assert (decode["prompt"], decode["tokens"], decode["steps_run"], decode["cache_length"]) == (8, 4, 4, 12), key
        assert decode["tokens_per_s"] > 0 and decode["prefill_ms"] > 0, key
        assert decode["speedup"] == (1.0 if key[0] == "fp32" else pytest.approx(
            rows[("fp32", key[1])]["decode"]["decode_ms_per_token"] / decode["decode_ms_per_token"]))
    assert "float16" in rows[("fp16", "ort:cpu")]["decode"]["layout"]  # the past fed in its declared type
    markdown = (tmp_path / "run" / "report.md").read_text()
    assert "## Decode (language model, KV cache)" in markdown and "fp16 decode" in markdown
