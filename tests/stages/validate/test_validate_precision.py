"""Execution precision as a validated setting: on a CPU whose OpenVINO default is bfloat16, a row that misses its
tolerance there is tried pinned (f16 where the device has it, then f32); a pin that holds is the row's setting."""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest

import qdeploy.stages.validate as validate
from qdeploy.stages.validate import ValidateConfig
from qdeploy.stages.validate._precision import pinned_candidates
from qdeploy.targets.cpu_facts import DevicePrecisions, openvino_precisions, precisions_from_flags
from qdeploy.targets.int8_path import FLAGS_ENV
from tests.helpers.precision import AVX2_CPU, BF16_CPU, offset_model, openvino_runs_bf16_here
from tests.helpers.validate import artifact, by_pair, context, to_fp16


def _rows(tmp_path: Path) -> dict:
    model = offset_model()
    artifacts = {"exported": artifact(tmp_path / "ref.onnx", model),
                 "fp16": artifact(tmp_path / "fp16.onnx", to_fp16(model), ("export", "fp16"))}
    return by_pair(validate.run(artifacts, ["openvino:cpu"], ValidateConfig(samples=4), context(tmp_path)))


@pytest.mark.skipif(not openvino_runs_bf16_here(), reason="this machine's OpenVINO cannot run bfloat16: a bf16 "
                    "hint compiles in f32 here, so the bf16 default cannot be measured")
def test_a_row_missing_at_the_bf16_default_ships_the_pinned_f32_that_holds(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(FLAGS_ENV, BF16_CPU)  # a bf16 CPU, whatever the build machine's flags
    row = _rows(tmp_path)[("fp16", "openvino:cpu")]
    assert row.status == "passed", row.reason
    assert row.deploy_precision == "f32" and row.precision_hint == "f32"
    assert row.execution is not None and row.execution["precision"] == "f32"
    default, pinned = row.precision_attempts or []
    assert (default["setting"], default["ran"], default["status"]) == ("default", "bf16", "failed")
    assert default["metrics"]["cosine"] < 0.995  # what the default really gave, not the pinned numbers
    assert (pinned["setting"], pinned["ran"], pinned["status"]) == ("f32", "f32", "passed")
    assert row.metrics.cosine is not None and row.metrics.cosine > 0.9999
    assert any("misses its tolerance at the device default (bf16" in warning for warning in row.warnings)
    assert "bf16" in (row.effective_precision or "") or "f32" in (row.effective_precision or "")


def test_a_cpu_whose_default_is_f32_runs_the_default_in_f32_and_tries_nothing_more(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(FLAGS_ENV, AVX2_CPU)  # an AVX2 deployment CPU, even on a bf16 build machine
    row = _rows(tmp_path)[("fp16", "openvino:cpu")]
    assert row.status == "passed", row.reason
    assert row.execution is not None and row.execution["precision"] == "f32"
    assert row.precision_hint is None and row.deploy_precision is None and row.precision_attempts is None
    assert any(FLAGS_ENV in warning for warning in row.warnings)


def test_float32_artifacts_stay_pinned_to_f32_and_say_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(FLAGS_ENV, BF16_CPU)
    row = _rows(tmp_path)[("exported", "openvino:cpu")]
    assert row.precision_hint == "f32" and row.precision_attempts is None


def test_candidates_follow_what_ran_and_what_the_device_has(monkeypatch: pytest.MonkeyPatch) -> None:
    bf16_only = precisions_from_flags(set(BF16_CPU.split()), "given")
    assert bf16_only.default == "bf16" and not bf16_only.has_f16
    monkeypatch.setenv(FLAGS_ENV, BF16_CPU)
    assert pinned_candidates("openvino:cpu", {"precision": "bf16"}) == ["f32"]
    monkeypatch.setenv(FLAGS_ENV, f"{BF16_CPU} amx_fp16")
    assert pinned_candidates("openvino:cpu", {"precision": "bf16"}) == ["f16", "f32"]
    assert pinned_candidates("openvino:cpu", {"precision": "f32"}) == []
    assert pinned_candidates("ort:cpu", {"precision": "bf16"}) == []
    assert precisions_from_flags(set(AVX2_CPU.split()), "given") == DevicePrecisions("CPU", "f32", False, False,
                                                                                     "given")


def test_the_adapter_pins_the_precision_asked_and_says_when_the_device_ignored_it(tmp_path: Path) -> None:
    from qdeploy.targets import get_target

    path = tmp_path / "fp16.onnx"
    onnx.save(to_fp16(offset_model()), str(path))
    target = get_target("openvino:cpu")
    with target.load(path, precision="f32", pin_f32=False) as session:
        assert session.executed.precision == "f32" and session.requested_precision == "f32"
    with pytest.raises(ValueError, match="not one of"):
        target.load(path, precision="int8")
    if openvino_precisions("CPU").has_f16:
        return  # f16 really runs here: nothing is ignored
    with target.load(path, precision="f16") as session:  # OpenVINO compiles at another precision, silently
        assert session.executed.precision != "f16"
        assert any("INFERENCE_PRECISION_HINT f16 asked" in note for note in session.executed.notes)
