"""The fp16 budget's artifact is confirmed on each target of the recipe, not only in ONNX Runtime's emulation.

A stand-in runtime runs the artifact on ONNX Runtime but breaks it while the Sigmoid runs in float16 (as a
runtime whose float16 kernel for one op is wrong would); the real OpenVINO test checks that the record is what
validation measures there, on any CPU.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto

from qdeploy.core.compare import compare_outputs
from qdeploy.core.tolerance import Tolerance
from qdeploy.stages import fp16
from qdeploy.stages.accuracy_budget import targets as fp16_targets
from qdeploy.stages.fp16.config import Fp16Config
from qdeploy.targets.base import ExecutionInfo
from tests.helpers.fp16 import artifact, context, offset_budget_model, offset_budget_samples, run_ort

BROKEN = "sigmoid"


def runs_in_float16(model: onnx.ModelProto, node: str) -> bool:
    inferred = onnx.shape_inference.infer_shapes(model)
    types = {value.name: value.type.tensor_type.elem_type for value in inferred.graph.value_info}
    target = next(n for n in inferred.graph.node if n.name == node)
    return types.get(target.input[0]) == TensorProto.FLOAT16


class FakeSession:
    """ONNX Runtime's outputs, sign-flipped while the Sigmoid runs in float16."""

    def __init__(self, path: Path, loads: list[bool]) -> None:
        self.model = onnx.load(str(path))
        self.broken = runs_in_float16(self.model, BROKEN)
        loads.append(self.broken)
        self.executed = ExecutionInfo(target="openvino:cpu", runtime="fake", device="CPU", providers=[],
                                      precision="f32")  # a fault no precision pin helps

    def run(self, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        y = run_ort(self.model, feed)[0]
        return {"y": -y if self.broken else y}

    def __enter__(self) -> FakeSession:
        return self

    def __exit__(self, *exc: Any) -> None:
        pass


def run_budget(tmp_path: Path, targets: tuple[str, ...], tolerance: dict) -> Any:
    ctx = dataclasses.replace(context(tmp_path, {"val": offset_budget_samples(6)}), targets=targets)
    config = Fp16Config(mode="auto", calibration={"data": "val"}, tolerance=tolerance)
    return fp16.run(artifact(tmp_path, offset_budget_model()), config, ctx)


def test_a_target_that_misses_keeps_further_groups_float32_until_it_holds_there(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    loads: list[bool] = []
    real = fp16_targets.load_as_validated
    monkeypatch.setattr(fp16_targets, "load_as_validated", lambda name, path: (
        FakeSession(path, loads) if name == "openvino:cpu" else real(name, path)))
    result = run_budget(tmp_path, ("ort:cpu", "openvino:cpu"), {"cosine_min": 0.9999})
    budget = result.findings.budget
    assert budget["met_emulated"] is True and loads[0] is True  # the emulation's choice breaks on the target
    kept = {entry["node"]: entry["reason"] for entry in result.findings.kept_in_fp32}
    assert kept[BROKEN] == "budget: missed on a target" and kept["shift_up"] == "budget: sensitivity"
    assert not runs_in_float16(result.model, BROKEN) and False in loads  # the written artifact is one that held
    assert budget["targets"]["openvino:cpu"]["status"] == "confirmed"
    assert budget["targets"]["ort:cpu"]["status"] == "confirmed" and budget["met"] is True
    assert budget["phases"][0]["searched_on"] == "openvino:cpu, ort:cpu"
    assert budget["runtimes"]["openvino:cpu"]["evaluations"] == len(loads) >= 2
    assert "emulation (ort:cpu, gated float16 twin)" in budget["runtimes"]


def test_a_target_wrong_whatever_is_kept_is_reported_missed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    class AlwaysBroken(FakeSession):
        def run(self, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
            return {"y": -run_ort(self.model, feed)[0]}

    monkeypatch.setattr(fp16_targets, "load_as_validated", lambda name, path: AlwaysBroken(path, []))
    budget = run_budget(tmp_path, ("openvino:cpu", "ort:cuda"), {"cosine_min": 0.9999}).findings.budget
    assert budget["met"] is False and "budget not met on openvino:cpu" in budget["note"]
    record = budget["targets"]["openvino:cpu"]
    assert record["status"] == "missed" and record["cosine"] < 0 and "every node group float32" in record["reason"]
    assert budget["targets"]["ort:cuda"]["status"] == "unavailable" and budget["targets"]["ort:cuda"]["reason"]


def test_what_the_fp16_sidecar_says_of_openvino_is_what_validation_measures_there(tmp_path: Path) -> None:
    pytest.importorskip("openvino")
    result = run_budget(tmp_path, ("ort:cpu", "openvino:cpu"), {"cosine_min": 0.9999})
    budget = result.findings.budget
    record = budget["targets"]["openvino:cpu"]
    assert record["status"] in ("confirmed", "missed") and record["precision"]
    path = tmp_path / "fp16.onnx"
    onnx.save(result.model, str(path))
    feeds = offset_budget_samples(6)
    with fp16_targets.load_as_validated("openvino:cpu", path, record.get("deploy_precision")) as session:
        got = [session.run(feed) for feed in feeds]
    expected = [{"y": run_ort(offset_budget_model(), feed)[0]} for feed in feeds]
    holds = compare_outputs(expected, got, Tolerance(cosine_min=0.9999)).passed
    assert (record["status"] == "confirmed") == holds


def test_a_target_missing_at_its_bf16_default_is_confirmed_pinned_to_f32(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """As validation does, a miss at a bfloat16 default is tried pinned to f32 before any node is kept float32."""
    from qdeploy.targets.int8_path import FLAGS_ENV

    class BrokenInBf16(FakeSession):
        def __init__(self, path: Path, hint: str | None) -> None:
            super().__init__(path, [])
            self.broken = hint != "f32"
            self.executed = dataclasses.replace(self.executed, precision=hint or "bf16")

    monkeypatch.setenv(FLAGS_ENV, "avx2 avx512f avx512_bf16")
    hints: list[str | None] = []

    def load(name: str, path: Path, hint: str | None = None) -> BrokenInBf16:
        hints.append(hint)
        return BrokenInBf16(path, hint)

    monkeypatch.setattr(fp16_targets, "load_as_validated", load)
    result = run_budget(tmp_path, ("openvino:cpu",), {"cosine_min": 0.9999})
    record = result.findings.budget["targets"]["openvino:cpu"]
    assert record["status"] == "confirmed" and record["deploy_precision"] == "f32" and record["precision"] == "f32"
    assert record["default"]["status"] == "missed" and record["default"]["precision"] == "bf16"
    assert hints == [None, "f32"] and result.findings.budget["met"] is True
    assert not any(entry["reason"] == "budget: missed on a target" for entry in result.findings.kept_in_fp32)
