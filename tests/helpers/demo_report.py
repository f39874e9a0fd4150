"""report.json of a real demo run (`qdeploy run recipes/demo.yaml`, paths moved under /runs/demo), and a copy whose
rows differ per target in what ran: precision, provider, kernels, measurement plan."""

from __future__ import annotations

import copy
import json
from functools import cache
from pathlib import Path
from typing import Any

from qdeploy.pipeline.report.verdict import verdict_section

DEMO_REPORT = Path(__file__).resolve().parents[1] / "pipeline" / "demo_report.json"
CUDA = "ort:cuda"


@cache
def _demo() -> dict[str, Any]:
    return json.loads(DEMO_REPORT.read_text())


def demo_report() -> dict[str, Any]:
    """The demo run's report.json as written (ort:cpu and openvino:cpu measured; ort:cuda, openvino:gpu lacking)."""
    return copy.deepcopy(_demo())


def _row(report: dict[str, Any], key: str, variant: str, target: str) -> dict[str, Any]:
    return next(row for row in report[key] if row["variant"] == variant and row["target"] == target)


def mixed_rows_report() -> dict[str, Any]:
    """The demo's report with rows that differ, each fact held by one row only:

    - ort:cpu: int8 fails validation, so fp16 (which onnxruntime ran as 13 float32 kernels) ties with fp32 and
      ships as the smaller (the report's verdict is made with ``tie_break: size``); its package is the one written
      for ort:cpu;
    - openvino:cpu: fp32 pinned f32, fp16 and int8 at the bf16 default (as measured); int8 timed with another
      plan (50 runs, 1 thread) than the others;
    - ort:cuda: available, fp16 ran 11 fp16 kernels on CUDAExecutionProvider and 2 fp32 ones fell back to
      CPUExecutionProvider; fp32 all on CUDA.
    """
    report = demo_report()
    failed = _row(report, "validation", "int8", "ort:cpu")
    failed.update(status="failed", reason="cosine 0.95 < 0.98")
    int8_ov = _row(report, "benchmarks", "int8", "openvino:cpu")
    int8_ov.update(runs=50, threads=1)
    for variant, kernels, providers in (
            ("fp32", {"FP32": 12}, {"CUDAExecutionProvider": 12}),
            ("fp16", {"FP16": 11, "FP32": 2}, {"CUDAExecutionProvider": 11, "CPUExecutionProvider": 2})):
        execution = {"device": "CUDAExecutionProvider", "node_counts": providers, "precision": None,
                     "precisions": kernels, "providers": ["CUDAExecutionProvider", "CPUExecutionProvider"],
                     "runtime": "onnxruntime", "target": CUDA, "unsupported_ops": [], "notes": [], "op_types": {}}
        check = _row(report, "validation", variant, CUDA)
        source = _row(report, "validation", variant, "ort:cpu")
        check.update({**copy.deepcopy(source), "target": CUDA, "execution": execution, "warnings": []})
        bench = _row(report, "benchmarks", variant, CUDA)
        timed = copy.deepcopy(_row(report, "benchmarks", variant, "ort:cpu"))
        scale = 0.25 if variant == "fp16" else 0.5  # fp16 twice as fast as fp32 on the GPU, every round
        timed["latency_ms"] = {key: [v * scale for v in value] if isinstance(value, list) else value * scale
                               for key, value in timed["latency_ms"].items()}
        timed["round_p50_ms"] = [v * scale for v in timed["round_p50_ms"]]
        timed.update(target=CUDA, execution=execution, speedup=1.0 if variant == "fp32" else 2.0,
                     speedup_range=[1.0, 1.0] if variant == "fp32" else [1.9, 2.1])
        bench.clear()
        bench.update(timed)
    report["validation"] = [row for row in report["validation"] if (row["variant"], row["target"]) != ("int8", CUDA)]
    report["benchmarks"] = [row for row in report["benchmarks"] if (row["variant"], row["target"]) != ("int8", CUDA)]
    written = report["packages"]["written"]
    written[0].update(variant="fp16", path="/runs/demo/packages/ort-cpu-fp16")
    written.append({"checked": True, "path": "/runs/demo/packages/ort-cuda-fp16", "target": CUDA,
                    "unchecked_reason": None, "variant": "fp16"})
    report["environment"]["available_targets"].append(CUDA)
    report["verdict"] = verdict_section(report, tie_break="size")
    return report
