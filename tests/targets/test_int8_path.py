"""Which int8 path a CPU takes: detection (injectable), what it means per target, and `qdeploy doctor`."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from qdeploy.targets.int8_path import (
    SEVEN_BIT_KEY,
    cpu_flags,
    int8_path,
    saturation_note,
    saturation_risk,
    target_int8_paths,
    weights_beyond_seven_bits,
)

VNNI = {"avx2", "avx512f", "avx512bw", "avx512_vnni"}
AVX512_NO_VNNI = {"avx2", "avx512f", "avx512bw"}
AVX2 = {"avx2", "fma", "f16c"}


@pytest.mark.parametrize(("flags", "kind", "exact"), [
    (VNNI, "vnni", True),
    ({"avx2", "avx_vnni"}, "vnni", True),  # Alder Lake and later: AVX-VNNI without AVX512
    ({"avx2", "amx_int8", "avx512bw"}, "vnni", True),
    (AVX512_NO_VNNI, "avx512-no-vnni", False),  # Skylake-SP
    (AVX2, "avx2-only", False),  # AMD Zen 2/3, Haswell/Broadwell
    ({"sse4_2"}, "older-x86", False),
    (set(), "unknown", False),
])
def test_int8_path_of_each_x86_kind(flags: set[str], kind: str, exact: bool) -> None:
    path = int8_path(flags, machine="x86_64")
    assert (path.kind, path.exact) == (kind, exact)
    if not exact and kind != "unknown":
        assert "vpmaddubsw" in path.meaning and "saturating int16" in path.meaning


def test_arm64_accumulates_in_32_bits() -> None:
    path = int8_path({"fp", "asimd", "asimddp"}, machine="aarch64")
    assert path.kind == "arm64" and path.exact


def test_flags_can_be_injected_for_any_deployment_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QDEPLOY_CPU_FLAGS", "avx2,avx512f avx512bw  avx512_vnni")
    flags, source = cpu_flags()
    assert flags == VNNI and source == "$QDEPLOY_CPU_FLAGS"
    assert int8_path(machine="x86_64").kind == "vnni"
    monkeypatch.setenv("QDEPLOY_CPU_FLAGS", "avx2 fma")
    assert int8_path(machine="x86_64").kind == "avx2-only"


def test_each_cpu_target_says_whether_full_range_is_exact() -> None:
    targets = ["ort:cpu", "openvino:cpu", "ort:cuda", "reference:cpu"]
    saturating = target_int8_paths(int8_path(AVX2, machine="x86_64"), targets)
    exact = target_int8_paths(int8_path(VNNI, machine="x86_64"), targets)
    assert set(saturating) == set(exact) == {"ort:cpu", "openvino:cpu"}  # GPU and reference paths do not apply
    assert "can saturate" in saturating["ort:cpu"] and "reduce_range" in saturating["ort:cpu"]
    assert "MLAS" in saturating["ort:cpu"] and "oneDNN" in saturating["openvino:cpu"]
    assert "exact" in exact["ort:cpu"] and "saturate" not in exact["ort:cpu"]


def qdq_conv(max_weight: int, seven_bit: str | None = None) -> onnx.ModelProto:
    weight = np.full((4, 3, 3, 3), max_weight // 2, np.int8)
    weight[0, 0, 0, 0] = max_weight
    nodes = [helper.make_node("DequantizeLinear", ["wq", "ws"], ["w"]),
             helper.make_node("Conv", ["x", "w"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(weight, "wq"),
                               numpy_helper.from_array(np.array(0.01, np.float32), "ws")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    if seven_bit:
        helper.set_model_props(model, {SEVEN_BIT_KEY: seven_bit})
    return model


def test_full_range_weights_are_found_and_seven_bit_ones_are_not() -> None:
    assert weights_beyond_seven_bits(qdq_conv(127)) == ["wq"]
    assert weights_beyond_seven_bits(qdq_conv(64)) == []
    assert "1 int8 weight tensors use the full 8-bit range" in saturation_risk(qdq_conv(127))
    # qdeploy's own metadata: 7-bit activations make full-range weights safe
    assert saturation_risk(qdq_conv(127, seven_bit="activations")) is None
    assert saturation_risk(qdq_conv(127, seven_bit="none")) is not None


def test_saturation_note_only_where_the_cpu_path_saturates() -> None:
    risk = saturation_risk(qdq_conv(127))
    note = saturation_note(int8_path(AVX2, machine="x86_64"), "ort:cpu", risk)
    assert note is not None and "avx2-only" in note and "quantize.reduce_range" in note
    assert saturation_note(int8_path(VNNI, machine="x86_64"), "ort:cpu", risk) is None
    assert saturation_note(int8_path(AVX2, machine="x86_64"), "ort:cuda", risk) is None
    assert saturation_note(int8_path(AVX2, machine="x86_64"), "ort:cpu", None) is None


@pytest.mark.parametrize(("flags", "expected", "exact"), [
    ("avx2 fma", "int8 path: avx2-only [flags from $QDEPLOY_CPU_FLAGS]", False),
    ("avx2 avx512f avx512bw", "int8 path: avx512-no-vnni", False),
    ("avx2 avx512f avx512bw avx512_vnni", "int8 path: vnni", True),
])
def test_doctor_states_the_int8_path_per_cpu_target(flags: str, expected: str, exact: bool) -> None:
    env = {"QDEPLOY_CPU_FLAGS": flags, "PATH": "/usr/bin:/bin"}
    shown = subprocess.run([sys.executable, "-m", "qdeploy", "doctor"], capture_output=True, text=True,
                           env=env, cwd=Path(__file__).resolve().parents[2], timeout=120, check=True).stdout
    assert expected in shown
    lines = shown[shown.index("int8 path:"):].splitlines()
    ort_line = next(line for line in lines if line.strip().startswith("ort:cpu"))
    assert ("can saturate" in ort_line) is not exact
