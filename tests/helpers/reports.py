"""A synthetic report.json and its parts, for the report and compare tests."""

from __future__ import annotations

from typing import Any


def bench_row(variant: str, target: str, p50: float, rounds: list[float], **extra: Any) -> dict[str, Any]:
    return {"variant": variant, "target": target, "batch_size": 1, "status": "ok", "reason": "",
            "latency_ms": {"p50": p50, "p90": p50 * 1.2, "p99": p50 * 1.5, "mean": p50, "std": 0.1, "min": p50 * 0.9,
                           "max": p50 * 2, "ci95_p50": [p50 * 0.95, p50 * 1.05]},
            "throughput_per_s": 1000 / p50, "runs": 50, "round_p50_ms": rounds, "noisy": False,
            "memory": {"peak_growth_mb": 3.5, "method": "test"}, **extra}


def rate_latency(p50: float, p99: float | None = None) -> dict[str, float]:
    """The latency statistics of a throughput row (no std, no interval)."""
    top = p50 if p99 is None else p99
    return {"p50": p50, "p90": top, "p99": top, "mean": p50, "min": p50, "max": top}


def check_row(variant: str, target: str, cosine: float, snr: float, status: str = "passed", **extra: Any) -> dict:
    return {"variant": variant, "target": target, "status": status, "reason": "" if status == "passed" else "bad",
            "metrics": {"cosine": cosine, "snr_db": snr, "max_abs_err": 1 - cosine, "top1_agreement": 1.0},
            "warnings": [], **extra}


def synthetic_report() -> dict[str, Any]:
    """A report with every kind of row the writers must handle."""
    benchmarks = [
        bench_row("fp32", "ort:cpu", 4.0, [4.0, 4.1, 3.9], speedup=1.0, speedup_range=[1.0, 1.0]),
        bench_row("fp16", "ort:cpu", 4.1, [3.8, 4.2, 4.0], speedup=0.99, speedup_range=[0.95, 1.05], noisy=True),
        bench_row("int8", "ort:cpu", 1.0, [1.0, 1.1, 0.9], speedup=4.0, speedup_range=[3.7, 4.3]),
        bench_row("slow", "ort:cpu", 9.0, [9.0, 9.1, 8.9], speedup=0.44, speedup_range=[0.43, 0.45]),
        {"variant": "fp32", "target": "ort:cuda", "batch_size": 1, "status": "unavailable",
         "reason": "target ort:cuda requested; this machine's onnxruntime has CPUExecutionProvider",
         "latency_ms": None, "throughput_per_s": None, "runs": 0, "round_p50_ms": [], "noisy": None},
    ]
    validation = [
        check_row("fp32", "ort:cpu", 1.0, 200.0),
        check_row("fp16", "ort:cpu", 0.99999, 52.0, warnings=["random validation data <hides> problems"]),
        check_row("int8", "ort:cpu", 0.999, 27.0, status="failed",
               divergence={"node": "conv_7", "op_type": "Conv", "tensor": "conv_7_out", "max_abs_err": 0.4,
                           "cosine": 0.97},
               unattainable=["atol 1e-6 is below the reference's own noise floor"]),
        check_row("slow", "ort:cpu", 0.99, 20.0),
        {"variant": "fp32", "target": "ort:cuda", "status": "unavailable", "reason": "no CUDA", "metrics": {}},
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


def report_with(**sections: Any) -> dict[str, Any]:
    """A minimal report.json holding ``sections`` (validation rows, artifacts, a verdict...): what a reader of one
    section is given, with the keys every report has.  Artifacts get a path and a sha256, a verdict its ranking."""
    base: dict[str, Any] = {"schema_version": 2, "recipe": {"name": "partial"}, "created": "2026-01-01T00:00:00Z",
                            "seconds": 0.0, "reference": {"variant": "fp32", "target": "ort:cpu"}, "passed": True}
    artifacts = [{"path": f"/runs/x/artifacts/{row['name']}.onnx", "sha256": "ab" * 32, **row}
                 for row in sections.pop("artifacts", [])]
    verdict = sections.pop("verdict", None)
    verdict = {"by": "latency", "batch_size": 1, **verdict} if verdict is not None else None
    return {**base, "artifacts": artifacts, **({"verdict": verdict} if verdict else {}), **sections}
