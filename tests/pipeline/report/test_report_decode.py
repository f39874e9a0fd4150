"""Decode records in the report: the speedup against the reference on the same target, report.json rows that keep
them (and the schema that holds them), and the Markdown and HTML decode tables, shown only when a row has one."""

from __future__ import annotations

from typing import Any

import jsonschema

from qdeploy.core.report import Report, report_schema
from qdeploy.pipeline.report import render_markdown
from qdeploy.pipeline.report.decode import decode_speedup, decode_speedup_line, with_decode_speedup
from qdeploy.pipeline.report.html import render_html
from tests.helpers.demo_report import demo_report

MS_PER_TOKEN = {"fp32": 4.0, "fp16": 5.0, "int8": 2.0}


def _record(variant: str) -> dict[str, Any]:
    ms = MS_PER_TOKEN[variant]
    return {"prompt": 8, "tokens": 4, "batch_size": 1, "prefill_ms": 3 * ms, "prefill_ci95_ms": [2.5 * ms, 3.5 * ms],
            "decode_ms_per_token": ms, "decode_ci95_ms": [0.9 * ms, 1.1 * ms], "tokens_per_s": 1e3 / ms,
            "cache_length": 12, "steps_run": 4, "repeats": 5, "steps_timed": 20, "bounded_by": "count",
            "max_seconds": 60.0, "seconds_spent": 0.5, "timed_call": "InferRequest.infer()", "ids": "dataset 'p'",
            "layout": "4 past/present pairs", "speedup": None}


def _with_decode() -> Report:
    data = demo_report()
    for row in data["benchmarks"]:
        if row["status"] == "ok":
            row["decode"] = _record(row["variant"])
    report = Report.model_validate(data)
    rows = report.benchmarks
    return report.replace(benchmarks=[with_decode_speedup(rows, row, "fp32") for row in rows])


def test_decode_speedup_is_the_reference_ms_per_token_over_the_variant_on_the_same_target() -> None:
    report = _with_decode()
    by_key = {(row.variant, row.target): row for row in report.benchmarks}
    int8 = by_key[("int8", "openvino:cpu")]
    assert decode_speedup(report.benchmarks, int8, "fp32") == 2.0 and int8.decode["speedup"] == 2.0
    assert by_key[("fp16", "ort:cpu")].decode["speedup"] == 0.8
    assert by_key[("fp32", "ort:cpu")].decode["speedup"] == 1.0
    assert decode_speedup_line(int8, "fp32") == "int8 decode 2.00x fp32 (500 vs 250 tokens/s)"
    assert decode_speedup_line(by_key[("fp32", "ort:cpu")], "fp32") == ""
    assert not by_key[("int8", "ort:cuda")].has("decode")  # unavailable rows carry none


def test_report_json_rows_keep_their_decode_records_and_the_schema_holds_them() -> None:
    report = _with_decode()
    written = report.to_json()
    assert Report.model_validate(written).to_json() == written
    jsonschema.validate(written, report_schema())
    decoded = [row for row in written["benchmarks"] if "decode" in row]
    assert len(decoded) == 6 and all(row["decode"]["cache_length"] == 12 for row in decoded)
    plain = demo_report()
    assert Report.model_validate(plain).to_json() == plain  # rows without decode keep their keys


def test_markdown_and_html_show_prefill_and_decode_columns_and_the_speedups() -> None:
    report = _with_decode()
    markdown = render_markdown(report)
    assert "## Decode (language model, KV cache)" in markdown
    header = next(line for line in markdown.splitlines() if line.startswith("| variant | target | batch | prompt"))
    assert "prefill ms [95% CI]" in header and "decode tokens/s" in header and "decode vs reference" in header
    assert "| int8 | openvino:cpu | 1 | 8 → 12 | 6.00 [5.00–7.00] | 2.00 | 500 | 2.00x | 4 of 4 × 5 | count |" \
        in markdown
    assert "- openvino:cpu: int8 decode 2.00x fp32 (500 vs 250 tokens/s)" in markdown
    html = render_html(report)
    assert "<h2>Decode (language model, KV cache)</h2>" in html and "<th>decode tokens/s</th>" in html
    assert "int8 decode 2.00x fp32" in html


def test_reports_without_decode_records_show_no_decode_table() -> None:
    report = Report.model_validate(demo_report())
    assert "Decode" not in render_markdown(report) and "Decode (language model" not in render_html(report)
