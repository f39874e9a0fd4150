"""The key structure of report.json's result rows: which keys each kind of row has, and their value types.

``key_schema(report)`` maps ``section/status`` (``validation/passed``, ``benchmarks/unavailable``...) to the keys
every such row has (``required``), the keys only some have (``optional``), and per key the JSON types seen;
``metrics`` and ``latency_ms`` are described one level down.  The records go by their own kind: ``gates/passed``,
``gates/failed``, ``gates/skipped``, ``failures/stage``, ``unmeasured/benchmark``...
tests/core/report_rows_schema.json holds it for the recipe ``ROWS_RECIPE`` (run on ``ROWS_TARGETS``) as
written by qdeploy before the rows, then the records, became typed models.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
SECTIONS = ("validation", "benchmarks", "throughput")
RECORDS = ("gates", "failures", "unmeasured")
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
  int8: [simplify, {{quantize: {{mode: ptq, calibration: {{data: calib}}, per_runtime: false}}}}]
  broken: [simplify, {{quantize: {{mode: ptq, calibration: {{data: calib}}, exclude_nodes: [no_such_node],
                                  per_runtime: false}}}}]
targets: [ort:cpu, ort:cuda, openvino:cpu]
validate: {{data: val, reference: fp32, samples: 4, tolerance: {{cosine_min: 0.99999}}}}
benchmark: {{batch_sizes: [1], warmup: 2, iterations: 6, rounds: 2, mode: both,
             throughput: {{seconds: 0.2, warmup_seconds: 0.05}}}}
gates:
  - {{variant: fp32, target: ort:cpu, metric: size_bytes, max: 1.0e+12}}
  - {{variant: fp16, target: ort:cpu, metric: speedup, min: 0.0}}
  - {{variant: fp32, target: ort:cpu, metric: inferences_per_s, min: 0.0}}
  - {{variant: int8, target: ort:cpu, metric: cosine, min: 0.99999}}
  - {{variant: int8, target: ort:cuda, metric: latency_ms, max: 1000.0, batch_size: 1}}
  - {{variant: broken, target: ort:cpu, metric: cosine, min: 0.9}}
  - {{variant: fp32, target: openvino:cpu, metric: latency_ms, max: 1000.0}}
"""
"""The demo's model and data on ort:cpu and an absent ort:cuda: passed, failed (int8 under a strict cosine, with
its diverging node), unavailable and added (fp16 on reference:cpu) validation rows; latency and throughput rows.
Its gates pass (size, speedup, throughput), fail (int8's cosine, a latency on the absent target, a variant that
failed to build: ``broken`` excludes a node the model lacks) or are skipped (openvino:cpu is left out of the run:
it is not in ``ROWS_TARGETS``).  One int8 graph for both runtimes (``per_runtime: false``): the rows keep the
names the schema was written with."""
ROWS_TARGETS = ["ort:cpu", "ort:cuda"]

UNMEASURED_RECIPE = f"""
name: unmeasured-keys
model:
  onnx: {ROOT}/recipes/models/demo_cnn.onnx
  inputs:
    - {{name: input, shape: [1, 3, 64, 64], dtype: float32}}
  opset: 17
data:
  val: {{reader: npy, path: {ROOT}/recipes/data/val}}
variants:
  fp32: [simplify]
  fp16: [simplify, {{fp16: {{keep_io_types: true}}}}]
targets: [ort:cpu]
validate: {{data: val, reference: fp32, samples: 2}}
benchmark: {{batch_sizes: [1], warmup: 1, iterations: 2, rounds: 1, mode: both,
             throughput: {{seconds: 0.05, warmup_seconds: 0.0}}}}
report: {{allow_unmeasured: [validate]}}
"""
"""Run with every float16 session failing (``fail_float16_sessions``): its validation, latency and throughput rows
error, and ``unmeasured`` lists them, the validation allowed, the benchmarks not."""


def fail_float16_sessions(monkeypatch: Any) -> None:
    """Sessions of artifacts that do not run in float32 raise, in validation, latency and throughput alike."""
    import qdeploy.stages.benchmark as benchmark
    import qdeploy.stages.validate as validate
    import qdeploy.targets.pool as pool

    def refusing(real: Callable[..., Any], runs_float32: Callable[..., bool]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            if not runs_float32(*args, **kwargs):
                raise RuntimeError("float16 session refused (test)")
            return real(*args, **kwargs)
        return call

    def pinned(*_: Any, pin_f32: bool, **__: Any) -> bool:
        return pin_f32

    def float32_artifact(artifact: Any, *_: Any) -> bool:
        return artifact.precision == "fp32"

    monkeypatch.setattr(validate, "_run_model", refusing(validate._run_model, pinned))
    monkeypatch.setattr(benchmark, "_prepare", refusing(benchmark._prepare, float32_artifact))
    monkeypatch.setattr(pool, "open_pool", refusing(pool.open_pool, pinned))


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


def _group(section: str, row: dict[str, Any]) -> str:
    if section == "gates":
        return "skipped" if row["skipped"] else "passed" if row["passed"] else "failed"
    return row["kind"] if section in RECORDS else row["status"]


def key_schema(report: dict[str, Any], sections: tuple[str, ...] = (*SECTIONS, *RECORDS)) -> dict[str, Any]:
    groups: dict[str, list[dict[str, Any]]] = {}
    for section in sections:
        for row in report.get(section) or []:
            groups.setdefault(f"{section}/{_group(section, row)}", []).append(row)
    return {name: _describe(rows) for name, rows in sorted(groups.items())}
