"""The float32 weights wait on disk while an analysis session runs: the stage's result must not change."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from onnx import helper

from qdeploy.stages.fp16 import _offload
from tests.helpers.fp16 import const, make_model, run_stage, tensor


def _model() -> Any:
    """A MatMul on a 16 KB weight, then 1 / (y - 1000.3): float16 emulation finds the Inf, so the stage converts
    twice (the probe, the twin twice, and two conversions between them)."""
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"], name="matmul"),
             helper.make_node("Add", ["h", "shift"], ["s"], name="shift"),
             helper.make_node("Sub", ["s", "c"], ["d"], name="sub"),
             helper.make_node("Reciprocal", ["d"], ["y"], name="reciprocal")]
    weight = rng.standard_normal((64, 64)) * 1e-3
    return make_model(nodes, [const("w", weight), const("shift", 1000.5), const("c", 1000.3)],
                      [tensor("x", [2, 64])], [tensor("y", [2, 64])])


def _without_timings(findings: dict[str, Any]) -> dict[str, Any]:
    plain = {key: value for key, value in findings.items() if key != "seconds"}
    plain["fidelity"] = {name: {k: v for k, v in check.items() if "second" not in k}
                         for name, check in findings["fidelity"].items()}
    plain["budget"] = {k: v for k, v in findings.get("budget", {}).items() if k != "seconds"}
    return plain


def test_offloading_the_float32_weights_changes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    x = {"x": np.random.default_rng(1).standard_normal((2, 64)).astype(np.float32)}
    (tmp_path / "kept").mkdir()
    (tmp_path / "offloaded").mkdir()
    kept = run_stage(tmp_path / "kept", _model(), {"calib": [x, x]}, calibration={"data": "calib"})
    swaps = []
    original = _offload.offload

    def counted(*args: Any, **kwargs: Any) -> Any:
        swaps.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(_offload, "OFFLOAD_ABOVE_BYTES", 0)
    monkeypatch.setattr("qdeploy.stages.fp16.offload", counted)
    offloaded = run_stage(tmp_path / "offloaded", _model(), {"calib": [x, x]}, calibration={"data": "calib"})

    assert len(swaps) >= 3  # the probe and both emulation rounds ran with the weights on disk
    assert {entry["node"] for entry in offloaded.findings.kept_in_fp32} >= {"sub", "reciprocal"}
    assert offloaded.model.SerializeToString() == kept.model.SerializeToString()
    assert _without_timings(offloaded.findings.to_report()) == _without_timings(kept.findings.to_report())
    assert not list((tmp_path / "offloaded").rglob("float32_weights.onnx*"))


def test_outputs_waiting_on_disk_change_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """float32's and the emulation's outputs go to disk past a limit (a language model's logits): same result."""
    import qdeploy.core.output_store as output_store
    import qdeploy.stages.fp16 as fp16

    x = {"x": np.random.default_rng(1).standard_normal((2, 64)).astype(np.float32)}
    (tmp_path / "memory").mkdir()
    (tmp_path / "disk").mkdir()
    in_memory = run_stage(tmp_path / "memory", _model(), {"calib": [x, x]}, calibration={"data": "calib"})
    seen: list[type] = []
    original = fp16.judged

    def spy(reference: Any, outputs: Any, *args: Any) -> Any:
        seen.extend(type(sample) for sample in (*reference, *outputs))
        return original(reference, outputs, *args)

    monkeypatch.setattr(fp16, "judged", spy)
    monkeypatch.setattr(output_store, "KEEP_IN_MEMORY_BYTES", 0)
    on_disk = run_stage(tmp_path / "disk", _model(), {"calib": [x, x]}, calibration={"data": "calib"})
    assert seen and set(seen) == {output_store.DiskSample}  # float32's and the emulation's, both from disk
    assert on_disk.model.SerializeToString() == in_memory.model.SerializeToString()
    assert _without_timings(on_disk.findings.to_report()) == _without_timings(in_memory.findings.to_report())
