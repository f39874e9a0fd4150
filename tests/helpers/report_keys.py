"""The key structure of report.json's result rows: which keys each kind of row has, and their value types.

``key_schema(report)`` maps ``section/status`` (``validation/passed``, ``benchmarks/unavailable``...) to the keys
every such row has (``required``), the keys only some have (``optional``), and per key the JSON types seen;
``metrics`` and ``latency_ms`` are described one level down.  tests/pipeline/report_rows_schema.json holds it for
the recipe ``ROWS_RECIPE`` as written by qdeploy before the rows became typed models.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
SECTIONS = ("validation", "benchmarks", "throughput")
NESTED = ("metrics", "latency_ms")

ROWS_RECIPE = f"""
name: row-keys
model:
  onnx: {ROOT}/recipes/models/demo_cnn.onnx
  inputs:
    - {{name: input, shape: [1, 3, 64, 64], dtype: float32}}
  opset: 17
data:
  calib: {{reader: npy, path: {ROOT}/recipes/data/calib}}
  val: {{reader: npy, path: {ROOT}/recipes/data/val}}
variants:
  fp32: [simplify]
  fp16: [simplify, {{fp16: {{keep_io_types: true}}}}]
  int8: [simplify, {{quantize: {{mode: ptq, calibration: {{data: calib}}}}}}]
targets: [ort:cpu, ort:cuda]
validate: {{data: val, reference: fp32, samples: 4, tolerance: {{cosine_min: 0.99999}}}}
benchmark: {{batch_sizes: [1], warmup: 2, iterations: 6, rounds: 2, mode: both,
             throughput: {{seconds: 0.2, warmup_seconds: 0.05}}}}
"""
"""The demo's model and data on ort:cpu and an absent ort:cuda: passed, failed (int8 under a strict cosine, with
its diverging node), unavailable and added (fp16 on reference:cpu) validation rows; latency and throughput rows."""


def _kind(value: Any) -> str:
    return type(value).__name__


def _describe(rows: list[dict[str, Any]]) -> dict[str, Any]:
    keys = [set(row) for row in rows]
    required, everywhere = set.intersection(*keys), set.union(*keys)
    types = {key: sorted({_kind(row[key]) for row in rows if key in row}) for key in sorted(everywhere)}
    described: dict[str, Any] = {"required": sorted(required), "optional": sorted(everywhere - required),
                                 "types": types}
    for key in NESTED:
        inner = [row[key] for row in rows if isinstance(row.get(key), dict) and row[key]]
        if inner:
            described[key] = _describe(inner)
    return described


def key_schema(report: dict[str, Any]) -> dict[str, Any]:
    groups: dict[str, list[dict[str, Any]]] = {}
    for section in SECTIONS:
        for row in report.get(section) or []:
            groups.setdefault(f"{section}/{row['status']}", []).append(row)
    return {name: _describe(rows) for name, rows in sorted(groups.items())}
