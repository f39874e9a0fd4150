"""Which int8 arithmetic a CPU gives the runtimes, and what it means for full-range int8 weights.

On x86, ONNX Runtime's U8S8 kernels (S8S8 models are run as U8S8) and oneDNN's under OpenVINO multiply uint8
activations by int8 weights.  With VNNI (AVX512-VNNI, AVX-VNNI, AMX-INT8) every product accumulates exactly in
int32.  Without it they use ``vpmaddubsw``, which adds two u8*s8 products into a *saturating* int16:
255*127*2 = 64770 overflows 32767, and the sum is silently clipped.  Weights within 7 bits (|w| <= 64) cannot
overflow (255*64*2 = 32640), which is what ``reduce_range`` (ORT's name) buys.  arm64 accumulates int8 dot
products in 32 bits (sdot/udot, or widening multiply-adds) and does not saturate.

The CPU's flags come from /proc/cpuinfo; ``QDEPLOY_CPU_FLAGS`` (space or comma separated) replaces them, so a
test or a user can ask what a deployment CPU would do from any build machine.
"""

from __future__ import annotations

import os
import platform
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal, TypedDict

import numpy as np

__all__ = [
    "CPU_TARGETS",
    "SEVEN_BIT_KEY",
    "SEVEN_BIT_LIMIT",
    "Int8Path",
    "Int8PathDict",
    "cpu_flags",
    "int8_path",
    "saturation_note",
    "saturation_risk",
    "target_int8_paths",
    "weights_beyond_seven_bits",
]

FLAGS_ENV = "QDEPLOY_CPU_FLAGS"
CPU_TARGETS = ("ort:cpu", "openvino:cpu", "ort:openvino")
"""Targets whose int8 kernels run on the host CPU."""
SEVEN_BIT_KEY = "qdeploy.int8.seven_bit"
"""Model metadata naming the operand qdeploy kept within 7 bits ('weights', 'activations' or 'none')."""
SEVEN_BIT_LIMIT = 64
"""|w| <= 64 keeps vpmaddubsw's pair sums within int16 for any uint8 activation."""
_VNNI_FLAGS = ("avx512_vnni", "avx_vnni", "amx_int8")
PathKind = Literal["vnni", "avx512-no-vnni", "avx2-only", "older-x86", "arm64", "unknown"]


class Int8PathDict(TypedDict):
    """``Int8Path.to_dict()`` (report.json's ``environment.int8_path`` adds ``targets``)."""

    kind: PathKind
    exact: bool
    meaning: str
    flags_source: str


@dataclass(frozen=True)
class Int8Path:
    """The int8 path a CPU takes: its kind, whether full-range int8 weights are exact there, and what that means."""

    kind: PathKind
    exact: bool
    """Full-range int8 weights (8-bit) compute exactly: no intermediate saturation."""
    meaning: str
    flags_source: str

    def to_dict(self) -> Int8PathDict:
        return Int8PathDict(**asdict(self))


def cpu_flags() -> tuple[set[str], str]:
    """This CPU's feature flags and where they came from (the override variable, /proc/cpuinfo or nothing)."""
    override = os.environ.get(FLAGS_ENV)
    if override is not None:
        return {flag for flag in override.replace(",", " ").split() if flag}, f"${FLAGS_ENV}"
    cpuinfo = Path("/proc/cpuinfo")
    try:
        text = cpuinfo.read_text(errors="replace") if cpuinfo.is_file() else ""
    except OSError:
        text = ""
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):  # x86, arm64
            return set(value.split()), "/proc/cpuinfo"
    return set(), "unknown (no /proc/cpuinfo flags)"


def int8_path(flags: set[str] | None = None, machine: str | None = None) -> Int8Path:
    """The int8 path of a CPU with these flags (default: this machine's, or $QDEPLOY_CPU_FLAGS)."""
    source = "given"
    if flags is None:
        flags, source = cpu_flags()
    machine = (machine or platform.machine()).lower()
    if machine in ("aarch64", "arm64") or "asimd" in flags:
        return Int8Path("arm64", True, "arm64: int8 dot products accumulate in 32 bits; full-range int8 weights "
                                       "are exact", source)
    if any(flag in flags for flag in _VNNI_FLAGS):
        found = next(flag for flag in _VNNI_FLAGS if flag in flags)
        return Int8Path("vnni", True, f"VNNI ({found}): int8 products accumulate exactly in int32; 7-bit operands "
                                      "(reduce_range) only cost precision", source)
    saturating = ("the int8 kernels sum uint8 x int8 pairs with vpmaddubsw into a saturating int16, so full-range "
                  "int8 can clip silently; 7-bit weights or activations are exact")
    if "avx512bw" in flags:
        return Int8Path("avx512-no-vnni", False, f"AVX512 without VNNI: {saturating}", source)
    if "avx2" in flags:
        return Int8Path("avx2-only", False, f"AVX2 only, no VNNI: {saturating}", source)
    if not flags:
        return Int8Path("unknown", False, "CPU flags unknown: int8 may saturate as on CPUs without VNNI; 7-bit "
                                          "operands are exact everywhere", source)
    return Int8Path("older-x86", False, f"x86 without AVX2: {saturating}", source)


_KERNELS = {"ort:cpu": "ONNX Runtime's MLAS U8S8 kernels", "openvino:cpu": "oneDNN's u8s8 kernels",
            "ort:openvino": "oneDNN's u8s8 kernels (OpenVINO EP)"}
_WEIGHT_INPUT = {"DequantizeLinear": 0, "MatMulInteger": 1, "ConvInteger": 1, "QLinearConv": 3,
                 "QLinearMatMul": 3}
"""Where an op reads int8 weights."""


def target_int8_paths(path: Int8Path, targets: list[str]) -> dict[str, str]:
    """For each CPU target among ``targets``: which int8 kernels it runs here and whether full range is exact."""
    if path.exact:
        verdict = "exact with full-range int8 (int32 accumulation)"
    else:
        verdict = ("full-range int8 can saturate; exact with 7-bit weights or activations (quantize.reduce_range: "
                   "auto, the default for CPU targets)")
    return {target: f"{_KERNELS[target]}: {verdict}" for target in targets if target in _KERNELS}


def weights_beyond_seven_bits(model: Any) -> list[str]:
    """Names of int8 weight initializers (of Q/DQ and integer ops) that use values beyond 7 bits (|w| > 64)."""
    from onnx import TensorProto, numpy_helper

    weights = {node.input[_WEIGHT_INPUT[node.op_type]] for node in model.graph.node
               if node.op_type in _WEIGHT_INPUT and len(node.input) > _WEIGHT_INPUT[node.op_type]}
    wide = []
    for tensor in model.graph.initializer:
        if tensor.data_type != TensorProto.INT8 or tensor.name not in weights or tensor.data_location == 1:
            continue
        values = numpy_helper.to_array(tensor)
        if values.size > 1 and int(np.abs(values.astype(np.int16)).max()) > SEVEN_BIT_LIMIT:
            wide.append(tensor.name)
    return wide


def saturation_risk(model: Any) -> str | None:
    """What in an int8 model can saturate without VNNI, or None (7-bit operands, or no full-range weights)."""
    seven_bit = next((prop.value for prop in model.metadata_props if prop.key == SEVEN_BIT_KEY), None)
    if seven_bit in ("weights", "activations"):
        return None
    wide = weights_beyond_seven_bits(model)
    if not wide:
        return None
    return f"{len(wide)} int8 weight tensors use the full 8-bit range (e.g. {', '.join(wide[:3])})"


def saturation_note(path: Int8Path, target: str, risk: str | None) -> str | None:
    """Why an int8 artifact may diverge on ``target`` on this CPU, or None where it computes exactly."""
    if path.exact or target not in CPU_TARGETS or risk is None:
        return None
    return (f"this CPU's int8 path is {path.kind}: {risk}, and without VNNI the int8 kernels of {target} sum "
            "uint8 x int8 pairs into a saturating int16, so the artifact may diverge here and not on a VNNI CPU; "
            "build it with quantize.reduce_range: auto (the default) or weights, or validate on a VNNI CPU")
