"""Target adapters: one per runtime, behind one small interface.

A target is named ``runtime:device`` (``ort:cpu``, ``openvino:cpu``, ...).  An
adapter says whether its target exists on this machine (``availability``) and
loads a model into a ``Session`` that runs feeds and records what really ran
(``Session.executed``).  Comparing outputs is not done here: see
``qdeploy.core.compare``.

Nothing heavy is imported at module import time: onnxruntime, openvino and
onnx are imported by the adapter that needs them.  A target that does not exist
here raises ``TargetUnavailable``; one that exists but ran the model elsewhere
(a GPU provider that fell back to CPU) raises ``TargetFellBack``.  Neither
hands back a silent substitute (a CPU result labelled GPU, a bfloat16 result
labelled float32).  The OpenVINO adapter lives in ``qdeploy.targets.openvino``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from qdeploy.targets.base import (
    ExecutionInfo,
    Session,
    TargetAdapter,
    TargetFellBack,
    check_feeds,
    not_here,
    onnx_io_names,
    short_message,
)
from qdeploy.targets.bound import BoundCall, OrtBoundCall
from qdeploy.targets.cpu_facts import default_hint
from qdeploy.targets.onnxruntime import OrtSession, OrtTarget
from qdeploy.targets.openvino import OpenVinoSession, OpenVinoTarget
from qdeploy.targets.reference import ReferenceSession, ReferenceTarget

__all__ = [
    "KNOWN_TARGETS",
    "TRUE_FP16_TARGET",
    "BoundCall",
    "ExecutionInfo",
    "OpenVinoSession",
    "OpenVinoTarget",
    "OrtBoundCall",
    "OrtSession",
    "OrtTarget",
    "ReferenceSession",
    "ReferenceTarget",
    "Session",
    "TargetAdapter",
    "TargetFellBack",
    "available_targets",
    "check_feeds",
    "get_target",
    "load_as_deployed",
    "onnx_io_names",
    "short_message",
    "true_fp16_check",
]

KNOWN_TARGETS: tuple[str, ...] = (
    "ort:cpu", "ort:cuda", "ort:tensorrt", "ort:openvino",
    "openvino:cpu", "openvino:gpu", "openvino:npu",
    "reference:cpu",
)

TRUE_FP16_TARGET = "reference:cpu"
"""Where float16 arithmetic really happens on a machine without a GPU (CPU providers compute fp16 in float32)."""
GPU_TARGETS = ("ort:cuda", "ort:tensorrt", "openvino:gpu")


def true_fp16_check(targets: tuple[str, ...] | list[str], mode: str) -> bool:
    """Whether validation also runs fp16 artifacts on ``reference:cpu`` (validate.fp16_reference ``mode``):
    'always'; 'auto' when the recipe has no GPU target available here; never when the recipe names it already."""
    if mode == "never" or TRUE_FP16_TARGET in targets:
        return False
    return mode == "always" or not any(t in GPU_TARGETS and get_target(t).availability()[0] for t in targets)


def get_target(name: str) -> TargetAdapter:
    """The adapter of a target name; ValueError naming the known targets for an unknown one."""
    if name not in KNOWN_TARGETS:
        raise ValueError(f"unknown target '{name}'; known targets: {', '.join(KNOWN_TARGETS)}")
    runtime = name.split(":", 1)[0]
    return {"ort": OrtTarget, "openvino": OpenVinoTarget, "reference": ReferenceTarget}[runtime](name)


def availability_of(name: str) -> tuple[bool, str]:
    """(True, "") when target ``name`` can run here, else (False, the reason); an unknown name is a reason too.
    Never raises."""
    try:
        return get_target(name).availability()
    except ValueError as exc:  # an unknown target name
        return False, str(exc)
    except Exception as exc:  # availability must never raise; belt and braces for `qdeploy doctor`
        return False, f"target {name}: availability check failed: {short_message(exc)}"


def available_targets() -> dict[str, str]:
    """Every known target -> "" when available here, else the reason it is not, without the target's name (the
    listing names it: `qdeploy doctor`, report.json's environment)."""
    return {name: "" if ok else reason.removeprefix(not_here(name, "")) for name, (ok, reason) in
            ((n, availability_of(n)) for n in KNOWN_TARGETS)}




def load_as_deployed(target: str, path: Path, hint: str | None = None, *, trial: bool = False) -> Session:
    """A reduced-precision (fp16, int8) artifact loaded on ``target`` as validation and deployment run it: at the
    device's default precision (bfloat16 float parts on an OpenVINO CPU with AVX512-BF16; the injected CPU's
    default under $QDEPLOY_CPU_FLAGS), or pinned to ``hint`` (OpenVINO's INFERENCE_PRECISION_HINT).
    ``trial``: a search's candidate, whose session notes no report shows (OpenVINO skips ``query_model``)."""
    adapter = get_target(target)
    hint = hint or default_hint(target)[0]
    options: dict[str, Any] = {"pin_f32": False}
    if hint is not None:
        options["precision"] = hint
    if trial and adapter.runtime == "openvino":
        options["query_support"] = False
    return adapter.load(path, **options)
