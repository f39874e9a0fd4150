"""The report: speedup ranges, the markdown page, and the shared view (matrix, Pareto front, findings)."""

from __future__ import annotations

import copy

import pytest

from qdeploy.core.rows import BenchmarkRow, ValidationRow
from qdeploy.pipeline.report import render_markdown
from qdeploy.pipeline.report.view import (
    TradeoffPoint,
    highlights,
    mark_pareto_front,
    matrix,
    summarize_value,
    tradeoff_points,
    validation_notes,
)
from qdeploy.pipeline.results.summary import speedup_range
from tests.helpers.reports import bench_row, synthetic_report


def test_speedup_range_is_the_spread_of_per_round_ratios() -> None:
    rows = [BenchmarkRow.from_json(bench_row("ref", "ort:cpu", 4.0, [4.0, 6.0, 5.0])),
            BenchmarkRow.from_json(bench_row("v", "ort:cpu", 2.0, [2.0, 2.0, 4.0]))]
    assert speedup_range(rows, rows[1], "ref") == pytest.approx([1.25, 3.0])
    rows[0] = rows[0].replace(status="error")
    assert speedup_range(rows, rows[1], "ref") is None


def test_matrix_joins_benchmarks_validation_and_sizes() -> None:
    rows = {(row.variant, row.target): row for row in matrix(synthetic_report())}
    int8 = rows[("int8", "ort:cpu")]
    assert int8.size_bytes == 500_000 and int8.metrics.cosine == 0.999 and int8.p50 == 1.0
    assert int8.status == "failed"
    assert rows[("fp32", "ort:cuda")].status == "unavailable"
    assert rows[("fp16", "ort:cpu")].speedup_undecided and not rows[("int8", "ort:cpu")].speedup_undecided


def test_pareto_front() -> None:
    points = [TradeoffPoint("a", "t", 1.0, 20.0), TradeoffPoint("b", "t", 2.0, 50.0),
              TradeoffPoint("c", "t", 3.0, 40.0), TradeoffPoint("d", "t", 2.0, 50.0), TradeoffPoint("e", "t", 5, 60)]
    mark_pareto_front(points)
    assert {p.variant for p in points if p.on_front} == {"a", "b", "d", "e"}  # c: b is faster and closer

    front, label = tradeoff_points(synthetic_report())
    on_front = {p.variant for p in front if p.on_front}
    # int8 is fastest but failed its validation: no point at all (issue 18); fp16 is slower than fp32 and less exact
    assert label.startswith("SNR") and on_front == {"fp32"} and "int8" not in {p.variant for p in front}
    assert "slow" not in on_front and {p.target for p in front} == {"ort:cpu"}


def test_findings_highlights_name_what_matters() -> None:
    findings = {"clamp": {"clamped_values": 3, "max_finite_val": 65504.0}, "kept_in_fp32": ["pow_1"],
                "op_block_list": ["TopK"], "excluded": [], "nested": {"lowered_patterns": {"FakeQuantize": 2}}}
    lines = highlights(findings)
    assert "clamp.clamped_values: 3" in lines
    assert "kept_in_fp32: pow_1" in lines
    assert "nested.lowered_patterns: {FakeQuantize=2}" in lines
    assert not any(line.startswith(("excluded", "op_block_list", "clamp.max_finite")) for line in lines)
    assert summarize_value(list(range(12)), limit=3) == "0, 1, 2, … (+9 more)"


def test_validation_notes_render_divergence_unattainable_and_warnings() -> None:
    rows = {row["variant"]: ValidationRow.from_json(row) for row in synthetic_report()["validation"]}
    notes = validation_notes(rows["int8"])
    assert any("conv_7" in note and "Conv" in note and "0.4" in note for note in notes)
    assert any(note.startswith("unattainable: atol") for note in notes)
    assert validation_notes(rows["fp16"]) == ["random validation data <hides> problems"]


def test_markdown_shows_gates_first_then_matrix_and_the_notes() -> None:
    text = render_markdown(synthetic_report())
    assert text.index("## Gates") < text.index("## Latency and accuracy") < text.index("## Artifacts")
    assert "**FAIL**" in text and "**FAILED**" in text
    assert "≈1x (0.95–1.05)" in text and "0.99x" not in text  # the fp16 rounds disagree on which is faster
    assert "(noisy)" in text
    assert "Pareto front" in text and "int8 on ort:cpu" in text
    assert "conv_7" in text and "noise floor" in text
    assert "variant **broken**" not in text and "variant broken, stage quantize: already quantized" in text
    assert "fp16: kept_in_fp32: pow_1, exp_2" in text
    assert "ort:cuda" in text and "unavailable" in text


def test_markdown_without_benchmarks_or_gates() -> None:
    report = copy.deepcopy(synthetic_report())
    report["benchmarks"], report["gates"] = [], []
    text = render_markdown(report)
    assert "No gates in the recipe." in text
    assert "| int8 | ort:cpu | – |" in text  # validated pairs still listed
