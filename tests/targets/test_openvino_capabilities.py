"""A device's OPTIMIZATION_CAPABILITIES decide what precision ran and whether a float16 model can run at all.

Seen on a lent NVIDIA H200 machine (docs/measurements/2026-12-04-openvino-gpu-nvidia.md): OpenVINO's GPU plugin
drives it through PoCL's OpenCL, reports INFERENCE_PRECISION_HINT f16 by default, lists capabilities FP32, BIN,
INT8, runs every layer in f32, and cannot compile a float16 model.  The GPU is faked here; OpenVINO's CPU plugin
reads and runs the models.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from qdeploy.core.errors import ModelError, TargetUnavailable
from qdeploy.targets import cpu_facts
from qdeploy.targets import openvino as ov_target
from qdeploy.targets.openvino import OpenVinoTarget

NVIDIA_OPENCL = {"FP32", "BIN", "INT8", "EXPORT_IMPORT"}


def _matmul_model(path: Path, dtype: int) -> Path:
    np_type = helper.tensor_dtype_to_np_dtype(dtype)
    weight = numpy_helper.from_array(np.eye(4, dtype=np_type), "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", dtype, [1, 4])],
                              [helper.make_tensor_value_info("y", dtype, [1, 4])], [weight])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


class _FailingCompile:
    """OpenVINO's core with compile_model failing as the GPU plugin's did on a float16 model."""

    def __init__(self, core: Any) -> None:
        self._core = core

    def __getattr__(self, name: str) -> Any:
        return getattr(self._core, name)

    def compile_model(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("[GPU] Could not find a suitable kernel for convert:Convert_1")


@pytest.fixture
def failing_compile(monkeypatch: pytest.MonkeyPatch) -> None:
    core = _FailingCompile(ov_target._ov_core())
    monkeypatch.setattr(ov_target, "_ov_core", lambda: core)


def test_a_reduced_hint_the_device_has_no_kernels_for_is_reported_as_f32(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ov_target, "device_capabilities", lambda device: NVIDIA_OPENCL)
    notes: list[str] = []
    assert ov_target._capable_precision("GPU.0", "f16", {"FP32": 12}, notes) == "f32"
    assert "no FP16" in notes[0] and "FP32 12" in notes[0]
    monkeypatch.setattr(ov_target, "device_capabilities", lambda device: {*NVIDIA_OPENCL, "FP16"})
    assert ov_target._capable_precision("GPU.0", "f16", {"FP16": 12}, []) == "f16"
    monkeypatch.setattr(ov_target, "device_capabilities", lambda device: None)  # unknown: no claim either way
    assert ov_target._capable_precision("GPU.0", "f16", {"FP32": 12}, []) == "f16"


def test_the_cpu_plugins_bf16_default_keeps_its_name_on_this_machine() -> None:
    """The rule leaves a device that has the kernels alone: OpenVINO's CPU lists BF16 where it defaults to it."""
    facts = cpu_facts.openvino_precisions("CPU")
    assert (facts.default == "bf16") == ("BF16" in ov_target.device_capabilities("CPU"))


class _GpuCore:
    """What OpenVINO answered for the H200's GPU device."""

    def get_property(self, device: str, key: str) -> Any:
        import openvino

        return {"INFERENCE_PRECISION_HINT": openvino.Type.f16,
                "OPTIMIZATION_CAPABILITIES": sorted(NVIDIA_OPENCL)}[key]


def test_a_gpu_whose_f16_default_has_no_kernels_has_no_reduced_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cpu_facts, "_ov_core", lambda: _GpuCore())
    facts = cpu_facts.openvino_precisions("GPU")
    assert (facts.default, facts.has_f16, facts.reduced_default) == ("f32", False, False)
    assert cpu_facts.pins_after("openvino:gpu", "f16") == ["f32"]  # never an f16 pin it cannot run


def test_a_float16_model_failing_on_a_device_without_fp16_is_unavailable_there(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failing_compile: None) -> None:
    monkeypatch.setattr(ov_target, "device_capabilities", lambda device: NVIDIA_OPENCL)
    target = OpenVinoTarget("openvino:cpu")
    with pytest.raises(TargetUnavailable, match=r"has no float16 kernels .*FP32.*fp16\.onnx holds float16"):
        target.load(_matmul_model(tmp_path / "fp16.onnx", TensorProto.FLOAT16), query_support=False)
    with pytest.raises(ModelError, match="cannot compile"):  # a float32 model's failure stays the artifact's
        target.load(_matmul_model(tmp_path / "fp32.onnx", TensorProto.FLOAT), query_support=False)


def test_a_device_with_fp16_kernels_keeps_the_compile_failure_as_the_artifacts(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failing_compile: None) -> None:
    monkeypatch.setattr(ov_target, "device_capabilities", lambda device: {*NVIDIA_OPENCL, "FP16"})
    with pytest.raises(ModelError, match="cannot compile"):
        OpenVinoTarget("openvino:cpu").load(_matmul_model(tmp_path / "fp16.onnx", TensorProto.FLOAT16),
                                            query_support=False)


def test_the_throughput_pool_says_the_same_of_a_float16_model(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failing_compile: None) -> None:
    from qdeploy.targets import pool

    monkeypatch.setattr(ov_target, "device_capabilities", lambda device: NVIDIA_OPENCL)
    monkeypatch.setattr(pool, "_ov_core", ov_target._ov_core)
    feeds = {"x": np.ones((1, 4), dtype=np.float16)}
    with pytest.raises(TargetUnavailable, match="has no float16 kernels"):
        pool.open_pool("openvino:cpu", _matmul_model(tmp_path / "fp16.onnx", TensorProto.FLOAT16), feeds, 2)
