"""A report's ``layers`` section written by hand: one int8 pair on ort:cpu with a float Conv, a layout gap and an
overflow-free error list (what report.md, report.html and `qdeploy explain` render)."""

from __future__ import annotations

from typing import Any

__all__ = ["layers_section"]


def _row(layer: str, op: str, precision: str, ms: float, **more: Any) -> dict[str, Any]:
    return {"layer": layer, "op": op, "exec": "CPUExecutionProvider", "precision": precision, "time_ms": ms,
            "nodes": [layer], "macs": None, "snr_db": None, "cosine": None, "nonfinite": 0, "decision": None,
            "snr_drop_db": None, "nonfinite_born": False, **more}


def layers_section(layers: int = 4) -> dict[str, Any]:
    rows = [_row("conv_token_1", "QLinearConv", "int8", 0.5, macs=900, snr_db=32.0, snr_drop_db=168.0),
            _row("Transpose", "Transpose", "int8", 0.3, nodes=[]),
            _row("conv2", "Conv", "f32", 0.2, macs=100, snr_db=30.0, snr_drop_db=2.0,
                 decision="kept float by the accuracy budget (rank 1: ranked 1 of 2 by the error it adds)"),
            *[_row(f"relu{i}", "Relu", "int8", 0.01, snr_db=30.0, snr_drop_db=0.0) for i in range(layers - 3)]]
    timeline = {"layer": [r["layer"] for r in rows], "time_ms": [r["time_ms"] for r in rows],
                "precision": [r["precision"] for r in rows], "snr_db": [r["snr_db"] for r in rows]}
    summary = {"by_precision": {}, "time_ms": sum(r["time_ms"] for r in rows), "macs": 1000, "slow": None,
               "lines": ["int8 kernels: 90% of MACs, 80% of time on ort:cpu",
                         "1 Conv ran in float: kept float by the accuracy budget (rank 1: ranked 1 of 2 by the error "
                         "it adds)"]}
    pair = {"variant": "int8", "target": "ort:cpu", "why": "shipped", "precision": "int8", "status": "ok",
            "samples": 2, "exposure": {"changed": False, "note": "exposing the intermediate tensors left the final "
                                                                  "outputs on ort:cpu unchanged"},
            "profile": {"runs": 5, "profiled_ms": 1.2, "benchmark_p50_ms": 1.0}, "summary": summary,
            "top_time": sorted(rows, key=lambda r: -r["time_ms"])[:10], "top_error": rows[:1] + rows[2:3],
            "rows_total": len(rows), "timeline": timeline, "unclaimed_nodes": ["bn"], "decisions": {},
            "pinned_precision": None, "seconds": 0.4}
    return {"mode": "auto", "top": 10, "seconds": 0.5, "pairs": [pair]}
