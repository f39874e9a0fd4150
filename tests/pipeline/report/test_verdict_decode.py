"""The verdict of a language model with a KV cache: ranked by decode ms per token (not by the one prefill call of the
latency row) where every timed candidate carries a decode record; a report without decode keeps its verdict."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from qdeploy.core.report import Report
from qdeploy.pipeline.report.verdict import verdict_section
from qdeploy.pipeline.report.verdict_words import describe
from tests.helpers.reports import bench_row, check_row, report_with

# variant: prefill ms (rounds), decode ms per token, its 95% interval, SNR dB, size (as SmolLM2 135M on ort:cpu:
# int8 weight-only fastest by prefill, int4 slower than fp32 by prefill but fastest by far in decode)
MODEL: dict[str, tuple[float, float, list[float], float, int]] = {
    "fp32": (10.0, 8.0, [7.8, 8.2], 200.0, 540_000_000),
    "int8": (8.0, 6.0, [5.8, 6.2], 40.0, 170_000_000),
    "int4": (14.0, 3.7, [3.6, 3.8], 25.0, 110_000_000),
}


def _decode(ms: float, ci: list[float], reference_ms: float) -> dict[str, Any]:
    return {"prompt": 32, "tokens": 64, "batch_size": 1, "prefill_ms": 0.0, "prefill_ci95_ms": [0.0, 0.0],
            "decode_ms_per_token": ms, "decode_ci95_ms": ci, "tokens_per_s": 1e3 / ms, "cache_length": 96,
            "steps_run": 64, "repeats": 5, "steps_timed": 320, "bounded_by": "count", "max_seconds": 60.0,
            "seconds_spent": 3.0, "timed_call": "InferenceSession.run()", "ids": "dataset 'p'",
            "layout": "30 past/present pairs", "speedup": reference_ms / ms}


def _kv_report(model: dict[str, tuple[float, float, list[float], float, int]] | None = None,
               decode: bool = True) -> dict[str, Any]:
    model = model or MODEL
    ref_prefill, ref_decode = model["fp32"][0], model["fp32"][1]
    benchmarks, validation, artifacts = [], [], []
    for variant, (prefill, ms, ci, snr, size) in model.items():
        rounds = [prefill * f for f in (1.0, 1.02, 0.98, 1.01, 0.99)]
        ratio = ref_prefill / prefill
        row = bench_row(variant, "ort:cpu", prefill, rounds, speedup=ratio, speedup_range=[ratio * 0.97, ratio * 1.03])
        if decode:
            row["decode"] = {**_decode(ms, ci, ref_decode), "prefill_ms": prefill}
        benchmarks.append(row)
        validation.append(check_row(variant, "ort:cpu", 0.9999, snr))
        artifacts.append({"name": variant, "size_bytes": size, "stages": ["export", "quantize"]})
    return report_with(validation=validation, benchmarks=benchmarks, artifacts=artifacts, gates=[], failures=[])


def _ort(report: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    section = verdict_section(report)
    return section, section["targets"]["ort:cpu"]


def test_a_kv_cache_model_ships_the_fastest_decoder_not_the_fastest_prefill() -> None:
    section, ort = _ort(_kv_report())
    assert section["by"] == "decode" and ort["variant"] == "int4" and ort["status"] == "ship"
    assert ort["speedup"] == pytest.approx(8.0 / 3.7)  # the decode speedup, not prefill's 0.71x
    assert ort["speedup_range"] == pytest.approx([7.8 / 3.8, 8.2 / 3.6])
    assert ort["latency_ms"] == 14.0  # the row's prefill latency stays as it was measured
    assert "ranked by decode ms per token" in ort["why"] and "KV cache" in ort["why"]
    assert "3.70 ms per token decode" in ort["why"] and "2.16x the reference" in ort["why"]
    assert ort["rejected"]["int8"] == ("slower decode: 6.00 ms per token decode against 3.70 ms per token decode "
                                       "(int4), the 95% intervals do not overlap")
    assert ort["rejected"]["fp32"].startswith("slower decode: 8.00 ms per token decode")
    assert "speedup_vs_default" not in ort  # a prefill-only figure is not shown beside a decode ranking
    assert ort["decode_ms_per_token"] == 3.7
    report = Report.model_validate({**_kv_report(), "verdict": section})  # report.json's model accepts by: decode
    # the ship line says what ranked it: decode per token and its speedup, the prefill apart
    assert describe(report.verdict.targets["ort:cpu"]).startswith(
        "3.70 ms per token decode, 2.16x the reference's decode, prefill 14.0 ms, ")


def test_the_same_report_without_decode_records_keeps_its_latency_verdict() -> None:
    section, ort = _ort(_kv_report(decode=False))
    assert section["by"] == "latency" and ort["variant"] == "int8"
    assert ort["rejected"]["int4"].startswith("slower than the float reference fp32 on this target: 0.71x")
    assert "decode" not in ort["why"]


def test_one_timed_candidate_without_a_decode_record_keeps_the_target_on_latency() -> None:
    report = _kv_report()
    del report["benchmarks"][1]["decode"]  # int8's decode failed: prefill and decode are not compared
    section, ort = _ort(report)
    assert section["by"] == "latency" and ort["variant"] == "int8" and "decode" not in ort["why"]
    report = _kv_report()
    report["validation"][1].update(status="failed", reason="cosine 0.5")  # ... unless int8 is no candidate anyway
    del report["benchmarks"][1]["decode"]
    section, ort = _ort(report)
    assert section["by"] == "decode" and ort["variant"] == "int4"
    assert ort["rejected"]["int8"] == "validation failed: cosine 0.5"


def test_decode_ties_within_their_intervals_go_to_fidelity() -> None:
    model = copy.deepcopy(MODEL)
    model["int8"] = (8.0, 6.0, [5.0, 7.0], 40.0, 170_000_000)
    model["int4"] = (14.0, 5.8, [4.9, 6.9], 25.0, 110_000_000)
    section, ort = _ort(_kv_report(model))
    assert section["by"] == "decode" and ort["variant"] == "int8"  # closer to the reference than int4
    assert ort["runner_up"]["variant"] == "int4" and ort["speedup"] == pytest.approx(8.0 / 6.0)
    assert "ties with int4 within the benchmark's noise (6.00 ms per token decode against 5.80 ms per token " \
           "decode)" in ort["why"]
    assert "closer to the reference" in ort["why"] and "ranked by decode ms per token" in ort["why"]
    assert ort["rejected"]["fp32"].endswith("the 95% intervals do not overlap")


def test_a_variant_whose_decode_is_slower_than_the_reference_is_rejected_by_decode() -> None:
    model = copy.deepcopy(MODEL)
    model["int8"] = (6.0, 9.0, [8.8, 9.2], 40.0, 170_000_000)  # fastest prefill, slower decode than fp32
    del model["int4"]
    section, ort = _ort(_kv_report(model))
    assert section["by"] == "decode" and ort["variant"] == "fp32"
    assert ort["rejected"]["int8"].startswith("slower than the float reference fp32 on this target in decode ms per "
                                              "token: 0.89x (9.00 against 8.00 ms per token")
    model["int8"] = (6.0, 8.1, [7.7, 8.5], 40.0, 170_000_000)  # intervals overlap: cannot tell, a tie
    section, ort = _ort(_kv_report(model))
    assert ort["variant"] == "fp32" and ort["runner_up"]["variant"] == "int8"
    assert ort["runner_up"]["speedup_range"] == pytest.approx([7.8 / 8.5, 8.2 / 7.7])


def test_a_report_ranked_by_decode_renders_in_markdown_and_html() -> None:
    from qdeploy.pipeline.report import render_markdown
    from qdeploy.pipeline.report.html import render_html

    report = {**_kv_report(), "verdict": verdict_section(_kv_report())}
    assert "ranked by decode ms per token (a language model with a KV cache)" in render_markdown(report)
    assert "ranked by decode ms per token (a language model with a KV cache)" in render_html(report)
