"""The benchmark times the precision an artifact ships with: a pinned INFERENCE_PRECISION_HINT where validation
found the device default missing its tolerance, and each OpenVINO row says which hint it ran with."""

from __future__ import annotations

from pathlib import Path

from qdeploy.calibration import data_context
from qdeploy.core.rows import ThroughputRow, ValidationRow
from qdeploy.stages import benchmark
from qdeploy.stages.benchmark import BenchmarkConfig, shipped_precisions
from tests.helpers.validate import artifact, chain_model, to_fp16

CTX = data_context("*", Path("work"))


def test_the_shipped_pin_is_what_is_timed_and_the_row_says_so(tmp_path: Path) -> None:
    model = chain_model(width=32)
    artifacts = {"fp32": artifact(tmp_path / "fp32.onnx", model),
                 "fp16": artifact(tmp_path / "fp16.onnx", to_fp16(model), ("export", "fp16")),
                 "fp16_default": artifact(tmp_path / "fp16b.onnx", to_fp16(model), ("export", "fp16"))}
    shipped = shipped_precisions([
        ValidationRow(variant="fp16", target="openvino:cpu", status="passed", deploy_precision="f32"),
        ValidationRow(variant="fp16_default", target="openvino:cpu", status="passed")])
    assert shipped == {("fp16", "openvino:cpu"): "f32"}
    config = BenchmarkConfig(batch_sizes=[1], warmup=1, iterations=2, rounds=1, mode="both",
                             throughput={"seconds": 0.05, "warmup_seconds": 0.0})
    rows = benchmark.run(artifacts, ["openvino:cpu", "ort:cpu"], config, CTX, shipped=shipped)
    latency = {(r.variant, r.target): r for r in rows if not isinstance(r, ThroughputRow)}
    rates = {(r.variant, r.target): r for r in rows if isinstance(r, ThroughputRow)}
    for table in (latency, rates):
        pinned = table[("fp16", "openvino:cpu")]
        assert pinned.status == "ok", pinned.reason
        assert pinned.precision_hint == "f32"
        assert any("INFERENCE_PRECISION_HINT f32 pinned: the setting validation ships" in n for n in pinned.notes)
        assert table[("fp32", "openvino:cpu")].precision_hint == "f32"
        assert table[("fp16_default", "openvino:cpu")].precision_hint is None  # the device default
        assert not table[("fp16", "ort:cpu")].has("precision_hint")  # an OpenVINO setting only
    assert latency[("fp16", "openvino:cpu")].execution["precision"] == "f32"
    assert (rates[("fp16", "openvino:cpu")].settings or {}).get("INFERENCE_PRECISION_HINT") == "f32"


def test_the_injected_cpu_default_is_what_is_timed_as_validation_runs_it(tmp_path: Path, monkeypatch) -> None:
    """Under $QDEPLOY_CPU_FLAGS of a CPU without bf16, an fp16 artifact at the default is timed in f32, as
    validation runs it, whatever this machine's own default is."""
    monkeypatch.setenv("QDEPLOY_CPU_FLAGS", "avx2 fma avx512f")
    model = chain_model(width=16)
    artifacts = {"fp32": artifact(tmp_path / "fp32.onnx", model),
                 "fp16": artifact(tmp_path / "fp16.onnx", to_fp16(model), ("export", "fp16"))}
    config = BenchmarkConfig(batch_sizes=[1], warmup=1, iterations=2, rounds=1, mode="latency")
    rows = benchmark.run(artifacts, ["openvino:cpu"], config, CTX)
    fp16 = next(row for row in rows if row.variant == "fp16")
    assert fp16.status == "ok", fp16.reason
    assert fp16.precision_hint == "f32"
    assert fp16.execution["precision"] == "f32"
