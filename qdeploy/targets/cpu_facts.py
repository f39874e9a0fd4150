"""Which float precision OpenVINO runs a device's reduced-precision artifacts in by default, and which it can pin.

OpenVINO's CPU plugin runs the float parts of fp16 and int8 artifacts in bfloat16 on CPUs with AVX512-BF16 or
AMX-BF16 (its INFERENCE_PRECISION_HINT default there), in float16 on CPUs with AVX512-FP16 or AMX-FP16 where the
hint asks for it, and in float32 elsewhere.  A hint the device cannot honour is ignored silently (a bf16 hint on an
AVX2 CPU compiles in f32; an f16 hint on an AVX512-BF16 CPU compiles at its bf16 default), so what really ran is
always read back from the compiled model (``qdeploy.targets.openvino``).

The facts come from OpenVINO's own properties (INFERENCE_PRECISION_HINT, OPTIMIZATION_CAPABILITIES) for the
device; for ``CPU``, ``QDEPLOY_CPU_FLAGS`` (the variable ``qdeploy.targets.int8_path`` reads) replaces them, so a
test or a user can ask what a deployment CPU would do from any build machine.
"""

from __future__ import annotations

import logging
import os
from dataclasses import asdict, dataclass
from typing import TypedDict

from qdeploy.targets.int8_path import FLAGS_ENV, cpu_flags
from qdeploy.targets.openvino import PINNABLE, _ov_core, lacks_kernels

__all__ = ["BF16_FLAGS", "FP16_FLAGS", "PINNABLE", "DevicePrecisions", "DevicePrecisionsDict", "default_hint",
           "device_precisions", "openvino_precisions", "pins_after", "precisions_from_flags", "short_precision"]

log = logging.getLogger(__name__)

BF16_FLAGS = ("avx512_bf16", "amx_bf16")
"""x86 flags with which OpenVINO's CPU plugin defaults to bfloat16."""
FP16_FLAGS = ("avx512_fp16", "amx_fp16")
"""x86 flags with which OpenVINO's CPU plugin can run float16 (INFERENCE_PRECISION_HINT f16)."""
_OV_NAMES = {"float32": "f32", "f32": "f32", "bfloat16": "bf16", "bf16": "bf16", "float16": "f16", "f16": "f16"}


class DevicePrecisionsDict(TypedDict):
    """``DevicePrecisions.to_dict()``."""

    device: str
    default: str
    has_bf16: bool
    has_f16: bool
    source: str
    injected: bool


@dataclass(frozen=True)
class DevicePrecisions:
    """An OpenVINO device's default float precision, the reduced precisions it can run, and where that came from."""

    device: str
    default: str
    """INFERENCE_PRECISION_HINT's default: 'f32', 'bf16' or 'f16'."""
    has_bf16: bool
    has_f16: bool
    source: str
    injected: bool = False
    """True when the facts come from $QDEPLOY_CPU_FLAGS rather than from this machine's OpenVINO."""

    @property
    def reduced_default(self) -> bool:
        """The device runs float parts below float32 unless told otherwise."""
        return self.default != "f32"

    def to_dict(self) -> DevicePrecisionsDict:
        return DevicePrecisionsDict(**asdict(self))


def precisions_from_flags(flags: set[str], source: str, *, injected: bool = False) -> DevicePrecisions:
    """The CPU plugin's defaults on a CPU with these feature flags."""
    has_bf16 = any(flag in flags for flag in BF16_FLAGS)
    has_f16 = any(flag in flags for flag in FP16_FLAGS)
    return DevicePrecisions("CPU", "bf16" if has_bf16 else "f32", has_bf16, has_f16, source, injected)


def device_precisions(device: str = "CPU") -> DevicePrecisions:
    """The facts of an OpenVINO device (``CPU``, ``GPU``...): $QDEPLOY_CPU_FLAGS for the CPU when set, else what
    OpenVINO says of the device, else the CPU's /proc/cpuinfo flags."""
    device = device.upper()
    if device == "CPU" and os.environ.get(FLAGS_ENV) is not None:
        flags, source = cpu_flags()
        return precisions_from_flags(flags, source, injected=True)
    try:
        return openvino_precisions(device)
    except Exception as exc:  # no OpenVINO, or a device that answers nothing: the CPU's flags are all we know
        log.debug("OpenVINO cannot say the precisions of %s: %s", device, exc)
        if device != "CPU":
            return DevicePrecisions(device, "f32", False, False, f"unknown ({type(exc).__name__})")
        flags, source = cpu_flags()
        return precisions_from_flags(flags, source)


def openvino_precisions(device: str) -> DevicePrecisions:
    """What this machine's OpenVINO says of the device, whatever $QDEPLOY_CPU_FLAGS describes."""
    core = _ov_core()
    hint = core.get_property(device, "INFERENCE_PRECISION_HINT")
    name = hint.get_type_name() if hasattr(hint, "get_type_name") else str(hint)
    default = _OV_NAMES.get(name, name)
    capabilities = {str(item).upper() for item in core.get_property(device, "OPTIMIZATION_CAPABILITIES")}
    if lacks_kernels(default, capabilities):
        # the hint's default names a precision the device has no kernels for (f16 on an NVIDIA GPU through
        # PoCL's OpenCL): its float layers run in f32, so there is no reduced default to measure beside f32
        default = "f32"
    return DevicePrecisions(device, default, "BF16" in capabilities or default == "bf16",
                            "FP16" in capabilities or default == "f16",
                            f"OpenVINO {device} properties (INFERENCE_PRECISION_HINT, OPTIMIZATION_CAPABILITIES)")


def short_precision(ran: object) -> str | None:
    """An inference precision as OpenVINO reads it back ('float32', 'bf16'...) in short form ('f32', 'bf16')."""
    return _OV_NAMES.get(str(ran), str(ran)) if ran else None


def pins_after(target: str, ran: object) -> list[str]:
    """INFERENCE_PRECISION_HINT values worth trying on an OpenVINO ``target`` after its default ran ``ran`` below
    float32 and missed: f16 where the device has it (11 significant bits to bfloat16's 8, faster than f32) and it
    is not what already ran, then f32.  None for other runtimes or after a default that already ran in f32."""
    short = short_precision(ran)
    if not target.startswith("openvino:") or short in (None, "f32"):
        return []
    facts = device_precisions(target.split(":", 1)[1])
    return [*(["f16"] if facts.has_f16 and short != "f16" else []), "f32"]


def default_hint(target: str) -> tuple[str | None, str]:
    """The hint of a reduced-precision artifact's default run on ``target`` and a note: None (the device's own
    default), or, when $QDEPLOY_CPU_FLAGS describes the CPU, that CPU's default asked for explicitly."""
    if not target.startswith("openvino:"):
        return None, ""
    facts = device_precisions(target.split(":", 1)[1])
    if not facts.injected:
        return None, ""
    return facts.default, (f"default precision taken from {facts.source} (a CPU whose OpenVINO default is "
                           f"{facts.default}): compiled with INFERENCE_PRECISION_HINT {facts.default}")
