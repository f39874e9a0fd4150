"""The decode benchmark on a tiny Llama-style decoder (2 layers, hidden 64, past key/values as optimum writes them):
prefill and per-token decode records on ort:cpu and openvino:cpu, a time budget that stops a generation early and
says so, and models without a cache (or with decode off) left as they were."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest

from qdeploy.calibration import data_context
from qdeploy.calibration.spec import DatasetSpec
from qdeploy.core.context import Artifact, StageContext
from qdeploy.stages import benchmark
from qdeploy.stages.benchmark import BenchmarkConfig
from qdeploy.stages.benchmark._data import BenchData
from qdeploy.stages.benchmark._decode import _prompt_ids
from tests.helpers.models import tiny_cnn

TARGETS = ["ort:cpu", "openvino:cpu"]
PROMPT, TOKENS = 8, 4
FAST = {"iterations": 2, "warmup": 1, "rounds": 2, "busy_seconds": 0}


def _artifact(path: Path) -> Artifact:
    return Artifact(path=path, sidecar=path.with_suffix(".json"), key=path.stem, sha256="", size_bytes=0,
                    stages=(), parent=None)


@pytest.fixture(scope="module")
def decoder(tmp_path_factory: pytest.TempPathFactory) -> tuple[Artifact, StageContext]:
    pytest.importorskip("transformers")
    pytest.importorskip("openvino")
    from tests.helpers.decoder import export, write_prompts

    folder = tmp_path_factory.mktemp("decoder")
    path, config = export(folder / "decoder.onnx", layers=2, hidden=64, vocab=1000)
    write_prompts(folder / "prompts", config, 2, prompt=PROMPT)
    ctx = data_context("*", folder, datasets={"prompts": DatasetSpec(reader="npy", path=str(folder / "prompts"))})
    return _artifact(path), ctx


def _run(decoder: tuple[Artifact, StageContext], **settings: Any) -> dict[str, Any]:
    artifact, ctx = decoder
    config = BenchmarkConfig(data="prompts", **{**FAST, **settings})
    rows = benchmark.run({"fp32": artifact}, TARGETS, config, ctx)
    assert [row.status for row in rows] == ["ok", "ok"], [row.reason for row in rows]
    return {row.target: row for row in rows}


def test_prefill_and_decode_records_on_both_runtimes(decoder: tuple[Artifact, StageContext]) -> None:
    rows = _run(decoder, decode={"prompt": PROMPT, "tokens": TOKENS})
    for target, row in rows.items():
        record = row.decode
        assert record is not None, (target, row.notes)
        assert (record["prompt"], record["tokens"], record["batch_size"]) == (PROMPT, TOKENS, 1)
        assert record["steps_run"] == TOKENS and record["cache_length"] == PROMPT + TOKENS, target
        assert record["bounded_by"] == "count" and record["repeats"] == 2 and record["steps_timed"] == 2 * TOKENS
        assert record["prefill_ms"] > 0 and record["decode_ms_per_token"] > 0
        assert record["tokens_per_s"] == pytest.approx(1e3 / record["decode_ms_per_token"])
        low, high = record["prefill_ci95_ms"]
        assert low <= record["prefill_ms"] <= high
        assert "dataset 'prompts'" in record["ids"] and "past axis 2" in record["layout"]
        assert record["speedup"] is None  # the report sets it
        assert "decode" in row.to_json()
    # the runtimes' by-reference paths, each checked against Session.run before it was timed
    assert "run_with_ort_values" in rows["ort:cpu"].decode["timed_call"]
    assert "InferRequest" in rows["openvino:cpu"].decode["timed_call"]


def test_a_time_budget_stops_decoding_early_and_says_so(decoder: tuple[Artifact, StageContext]) -> None:
    rows = _run(decoder, decode={"prompt": PROMPT, "tokens": 50}, max_seconds=0.001)
    for target, row in rows.items():
        record = row.decode
        assert record is not None, target
        assert record["bounded_by"] == "max_seconds" and 1 <= record["steps_run"] < 50
        assert record["cache_length"] == PROMPT + record["steps_run"]
        assert any(note.startswith("decode stopped early") and "max_seconds" in note for note in row.notes)


def test_decode_off_keeps_the_plain_row(decoder: tuple[Artifact, StageContext]) -> None:
    rows = _run(decoder, decode=False)
    assert all(not row.has("decode") and "decode" not in row.to_json() for row in rows.values())


def test_a_model_without_a_cache_is_benchmarked_as_before(tmp_path: Path) -> None:
    path = tmp_path / "cnn.onnx"
    onnx.save(tiny_cnn(), path)
    rows = benchmark.run({"cnn": _artifact(path)}, ["ort:cpu"], BenchmarkConfig(**FAST),
                         data_context("*", tmp_path))
    assert rows[0].status == "ok" and "decode" not in rows[0].to_json()
    assert not any("decode" in note for note in rows[0].notes)


def test_prompt_ids_come_from_the_data_or_stay_inside_the_vocabulary() -> None:
    real = BenchData([{"input_ids": np.array([[3, 4, 5]])}], "dataset 'text'", random=False)
    ids, source = _prompt_ids(real, "input_ids", 7, vocab=10)
    assert ids.tolist() == [3, 4, 5, 3, 4, 5, 3] and "repeated to 7" in source
    fake = BenchData([{"input_ids": np.zeros((1, 4), np.int64)}], "seeded random data", random=True)
    ids, source = _prompt_ids(fake, "input_ids", 500, vocab=10)
    assert ids.min() >= 0 and ids.max() < 10 and "below 10" in source
    with pytest.raises(ValueError, match="outside the vocabulary"):
        _prompt_ids(BenchData([{"input_ids": np.array([[12]])}], "d", random=False), "input_ids", 4, vocab=10)


def test_an_ambiguous_cache_keeps_the_plain_benchmark_with_a_note(tmp_path: Path) -> None:
    """One past input, two present outputs that pair with it equally well: which one feeds it is a guess."""
    from onnx import TensorProto, helper

    past = helper.make_tensor_value_info("past_a.0", TensorProto.FLOAT, ["batch", 2, "past", 4])
    outputs = [helper.make_tensor_value_info(name, TensorProto.FLOAT, ["batch", 2, "total", 4])
               for name in ("present_x.0", "present_y.0")]
    graph = helper.make_graph(
        [helper.make_node("Cast", ["input_ids"], ["logits"], to=TensorProto.FLOAT),
         helper.make_node("Identity", ["past_a.0"], ["present_x.0"]),
         helper.make_node("Identity", ["past_a.0"], ["present_y.0"])], "ambiguous",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq"]), past],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", "seq"]), *outputs])
    path = tmp_path / "ambiguous.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    rows = benchmark.run({"lm": _artifact(path)}, ["ort:cpu"], BenchmarkConfig(**FAST), data_context("*", tmp_path))
    assert rows[0].status == "ok" and not rows[0].has("decode")
    assert any(note.startswith("decode benchmark skipped, plain benchmark only") and "pairs equally well" in note
               for note in rows[0].notes), rows[0].notes
