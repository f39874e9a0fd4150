"""Why a target is unavailable, worded so that it is true whoever asks: `qdeploy doctor` and report.json's
environment list every known target, which nobody requested; a recipe's unavailable rows name the target."""

from __future__ import annotations

from typer.testing import CliRunner

from qdeploy.cli import app
from qdeploy.pipeline.results.envinfo import environment
from qdeploy.targets import KNOWN_TARGETS, get_target


def test_doctor_lists_unavailable_targets_without_requested() -> None:
    result = CliRunner().invoke(app, ["doctor"])
    assert result.exit_code == 0, result.output
    listed = result.output.split("\ntargets:\n", 1)[1].splitlines()
    assert len(listed) == len(KNOWN_TARGETS), result.output
    for line in listed:
        name, state = line.split(maxsplit=1)
        assert "requested" not in state, line
        assert name not in state, line  # the listing names the target once, its reason says why


def test_report_environment_says_no_target_was_requested() -> None:
    for name, state in environment()["targets"].items():
        assert "requested" not in state and (state == "available" or state.startswith("unavailable: ")), (name, state)


def test_a_recipes_unavailable_row_names_its_target() -> None:
    for name in KNOWN_TARGETS:
        ok, reason = get_target(name).availability()
        if not ok:
            assert reason.startswith(f"target {name} is not available here; "), reason


def test_a_gpu_with_the_cpu_onnxruntime_says_which_wheel_to_install(monkeypatch) -> None:
    """Seen on a lent H200 machine: onnxruntime 1.30 CPU wheel beside a working CUDA 13 driver."""
    import onnxruntime

    from qdeploy.targets import onnxruntime as ort_adapter

    monkeypatch.setattr(onnxruntime, "get_available_providers", lambda: ["CPUExecutionProvider"])
    monkeypatch.setattr(ort_adapter, "nvidia_gpu_present", lambda: True)
    for name in ("ort:cuda", "ort:tensorrt"):
        ok, reason = get_target(name).availability()
        assert not ok and "NVIDIA GPU is present" in reason and "pip install onnxruntime-gpu" in reason, reason
    monkeypatch.setattr(ort_adapter, "nvidia_gpu_present", lambda: False)
    ok, reason = get_target("ort:cuda").availability()
    assert not ok and "NVIDIA" not in reason, reason
