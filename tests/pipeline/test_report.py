"""The report: speedup ranges, the markdown page, and the shared view (matrix, Pareto front, findings)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from pipeline.report import render_markdown, speedup_range
from pipeline.report_view import (
    TradeoffPoint,
    highlights,
    mark_pareto_front,
    matrix,
    summarize_value,
    tradeoff_points,
    validation_notes,
)


def _bench(variant: str, target: str, p50: float, rounds: list[float], **extra: Any) -> dict[str, Any]:
    return {"variant": variant, "target": target, "batch_size": 1, "status": "ok", "reason": "",
            "latency_ms": {"p50": p50, "p90": p50 * 1.2, "p99": p50 * 1.5, "mean": p50, "std": 0.1, "min": p50 * 0.9,
                           "max": p50 * 2, "ci95_p50": [p50 * 0.95, p50 * 1.05]},
            "throughput_per_s": 1000 / p50, "runs": 50, "round_p50_ms": rounds, "noisy": False,
            "memory": {"peak_growth_mb": 3.5, "method": "test"}, **extra}


def _check(variant: str, target: str, cosine: float, snr: float, status: str = "passed", **extra: Any) -> dict:
    return {"variant": variant, "target": target, "status": status, "reason": "" if status == "passed" else "bad",
            "metrics": {"cosine": cosine, "snr_db": snr, "max_abs_err": 1 - cosine, "top1_agreement": 1.0},
            "warnings": [], **extra}


def synthetic_report() -> dict[str, Any]:
    """A report with every kind of row the writers must handle."""
    benchmarks = [
        _bench("fp32", "ort:cpu", 4.0, [4.0, 4.1, 3.9], speedup=1.0, speedup_range=[1.0, 1.0]),
        _bench("fp16", "ort:cpu", 4.1, [3.8, 4.2, 4.0], speedup=0.99, speedup_range=[0.95, 1.05], noisy=True),
        _bench("int8", "ort:cpu", 1.0, [1.0, 1.1, 0.9], speedup=4.0, speedup_range=[3.7, 4.3]),
        _bench("slow", "ort:cpu", 9.0, [9.0, 9.1, 8.9], speedup=0.44, speedup_range=[0.43, 0.45]),
        {"variant": "fp32", "target": "ort:cuda", "batch_size": 1, "status": "unavailable",
         "reason": "target ort:cuda requested; this machine's onnxruntime has CPUExecutionProvider",
         "latency_ms": None, "throughput_per_s": None, "runs": 0, "round_p50_ms": [], "noisy": None},
    ]
    validation = [
        _check("fp32", "ort:cpu", 1.0, 200.0),
        _check("fp16", "ort:cpu", 0.99999, 52.0, warnings=["random validation data <hides> problems"]),
        _check("int8", "ort:cpu", 0.999, 27.0, status="failed",
               divergence={"node": "conv_7", "op_type": "Conv", "tensor": "conv_7_out", "max_abs_err": 0.4,
                           "cosine": 0.97},
               unattainable=["atol 1e-6 is below the reference's own noise floor"]),
        _check("slow", "ort:cpu", 0.99, 20.0),
        {"variant": "fp32", "target": "ort:cuda", "status": "unavailable", "reason": "no CUDA", "metrics": None},
    ]
    artifacts = [
        {"name": name, "path": f"/runs/x/artifacts/{name}.onnx", "sidecar": "", "sha256": "ab" * 32,
         "size_bytes": size, "parent": None, "stages": ["export", stage], "cached": False, "seconds": 0.1, "key": "k",
         "lineage": [{"stage": "export", "key": "k0", "cached": True, "seconds": 0.01, "config": {"opset": 17},
                      "findings": {"opset": 17}},
                     {"stage": stage, "key": "k1", "cached": False, "seconds": 0.5, "config": {"x": 1},
                      "findings": findings}]}
        for name, size, stage, findings in (
            ("fp32", 2_000_000, "simplify", {"folded_nodes": 8, "fold_skipped": []}),
            ("fp16", 1_000_000, "fp16", {"clamp": {"clamped_values": 3, "max_finite_val": 65504.0},
                                         "kept_in_fp32": ["pow_1", "exp_2"], "op_block_list": ["TopK"] * 40}),
            ("int8", 500_000, "quantize", {"lowered_patterns": [{"pattern": "FakeQuantize", "count": 2,
                                                                  "drift": 0.01}], "excluded": []}),
            ("slow", 2_000_000, "simplify", {"notes": ["<script>alert(1)</script>"]}),
        )
    ]
    return {
        "schema_version": 1, "recipe": {"name": "synthetic", "path": "/recipes/synthetic.yaml"},
        "created": "2026-01-01T00:00:00Z", "seconds": 12.5, "passed": False,
        "environment": {"python": "3.11.7", "platform": "Linux", "versions": {"onnx": "1.23", "openvino": "2026.4"},
                        "cpu": {"model": "Test CPU", "cores": 2, "flags": {"avx2": True, "amx_bf16": False}},
                        "targets": {"ort:cpu": "available", "ort:cuda": "unavailable: no CUDA"},
                        "available_targets": ["ort:cpu"]},
        "reference": {"variant": "fp32", "target": "ort:cpu"},
        "gates": [
            {"variant": "int8", "target": "ort:cpu", "metric": "speedup", "min": 1.2, "max": None, "batch_size": 1,
             "value": 4.0, "passed": True, "skipped": False, "reason": ""},
            {"variant": "int8", "target": "ort:cpu", "metric": "cosine", "min": 0.9999, "max": None,
             "batch_size": 1, "value": 0.999, "passed": False, "skipped": False, "reason": ""},
        ],
        "failures": [{"variant": "broken", "stage": "quantize", "reason": "already quantized", "kind": "stage"}],
        "artifacts": artifacts, "validation": validation, "benchmarks": benchmarks,
        "noise_floor": {"max_abs_err": 1e-6, "cosine": 0.9999999},
    }


def test_speedup_range_is_the_spread_of_per_round_ratios() -> None:
    rows = [_bench("ref", "ort:cpu", 4.0, [4.0, 6.0, 5.0]), _bench("v", "ort:cpu", 2.0, [2.0, 2.0, 4.0])]
    assert speedup_range(rows, rows[1], "ref") == pytest.approx([1.25, 3.0])
    rows[0]["status"] = "error"
    assert speedup_range(rows, rows[1], "ref") is None


def test_matrix_joins_benchmarks_validation_and_sizes() -> None:
    rows = {(row.variant, row.target): row for row in matrix(synthetic_report())}
    int8 = rows[("int8", "ort:cpu")]
    assert int8.size_bytes == 500_000 and int8.metrics["cosine"] == 0.999 and int8.latency["p50"] == 1.0
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
    rows = {row["variant"]: row for row in synthetic_report()["validation"]}
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
