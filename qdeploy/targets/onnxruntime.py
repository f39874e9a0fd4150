"""The ONNX Runtime targets (``ort:cpu``, ``ort:cuda``, ``ort:tensorrt``, ``ort:openvino``): one execution provider
and its declared fallbacks; a fallback that really happened is a failure (``TargetFellBack``), never a substitute."""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
import weakref
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypedDict

import numpy as np

from qdeploy.core.compare import as_arrays
from qdeploy.core.errors import DataError, ModelError
from qdeploy.targets.base import (
    INT8_ORT_OPS,
    ExecutionInfo,
    Session,
    TargetAdapter,
    TargetFellBack,
    check_feeds,
    not_here,
    short_message,
)
from qdeploy.targets.bound import BoundCall, OrtBoundCall

__all__ = ["OrtKernelArgs", "OrtProfileEvent", "OrtSession", "OrtTarget", "Port", "SessionInterface",
           "nvidia_gpu_present"]


class OrtKernelArgs(TypedDict, total=False):
    """The ``args`` of a kernel event of ORT's profile (the keys qdeploy reads)."""

    op_name: str
    provider: str
    input_type_shape: list[dict[str, list[int]]]
    """One ``{element type: shape}`` per input, e.g. ``[{"float": [1, 3, 8, 8]}]``."""
    output_type_shape: list[dict[str, list[int]]]


class OrtProfileEvent(TypedDict, total=False):
    """One event of ORT's profile (a Chrome trace): ``cat`` 'Node' for a kernel ('<node>_kernel_time'), 'Session'
    for a run ('model_run'); ``ts`` and ``dur`` in microseconds."""

    cat: str
    name: str
    ts: int
    dur: int
    args: OrtKernelArgs


def nvidia_gpu_present() -> bool:
    """Whether the NVIDIA driver shows a GPU (its device node or /proc entry), without loading any library."""
    gpus = Path("/proc/driver/nvidia/gpus")
    return Path("/dev/nvidia0").exists() or (gpus.is_dir() and any(gpus.iterdir()))


@dataclass(frozen=True)
class Port:
    """One input or output of a session, as plain values (name, ONNX Runtime's type string, shape)."""

    name: str
    type: str
    shape: tuple[Any, ...]


class SessionInterface:
    """A session's inputs and outputs, kept after the session (and its weights) are freed.

    ONNX Runtime's ``NodeArg`` objects keep their session alive, weights included, for as long as they live:
    holding them in place of the session freed nothing (a 2.2 GB model stayed resident while the next one
    loaded).  This copies what they say into plain ``Port``s.
    """

    def __init__(self, session: Any) -> None:
        self._inputs = [Port(arg.name, arg.type, tuple(arg.shape)) for arg in session.get_inputs()]
        self._outputs = [Port(arg.name, arg.type, tuple(arg.shape)) for arg in session.get_outputs()]

    def get_inputs(self) -> list[Port]:
        return self._inputs

    def get_outputs(self) -> list[Port]:
        return self._outputs

log = logging.getLogger(__name__)

_ORT_PROVIDERS: dict[str, list[str]] = {
    "cpu": ["CPUExecutionProvider"],
    "cuda": ["CUDAExecutionProvider", "CPUExecutionProvider"],
    "tensorrt": ["TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"],
    "openvino": ["OpenVINOExecutionProvider", "CPUExecutionProvider"],
}
_HIDDEN_PROVIDERS = frozenset({"AzureExecutionProvider"})
# ORT profile type names -> the precision names OpenVINO's runtime model uses, so both read alike.
_ORT_TYPE_NAMES = {"float": "FP32", "float16": "FP16", "bfloat16": "BF16", "double": "FP64", "int8": "I8",
                   "uint8": "U8", "int16": "I16", "uint16": "U16", "int32": "I32", "int64": "I64", "bool": "BOOL"}

class OrtTarget(TargetAdapter):
    """ONNX Runtime with one execution provider (and its declared fallbacks)."""

    runtime = "onnxruntime"

    @property
    def providers(self) -> list[str]:
        return list(_ORT_PROVIDERS[self.device])

    def availability(self) -> tuple[bool, str]:
        try:
            import onnxruntime
        except ImportError:
            return False, not_here(self.name, "onnxruntime is not installed (pip install onnxruntime, or "
                                               "onnxruntime-gpu for CUDA/TensorRT)")
        try:
            existing = [p for p in onnxruntime.get_available_providers() if p not in _HIDDEN_PROVIDERS]
        except Exception as exc:
            return False, not_here(self.name, f"onnxruntime cannot list its providers: {short_message(exc)}")
        if self.providers[0] in existing:
            return True, ""
        cause = f"this machine's onnxruntime has {', '.join(existing)}"
        if self.device in ("cuda", "tensorrt") and nvidia_gpu_present():
            # the usual case on a GPU machine: the CPU wheel of onnxruntime is installed, not onnxruntime-gpu
            cause += ("; an NVIDIA GPU is present, so this is a CPU-only onnxruntime build: "
                      "pip install onnxruntime-gpu (in place of onnxruntime)")
        return False, not_here(self.name, cause)

    def load(self, model_path: Path, *, threads: int | None = None, pin_f32: bool = True) -> Session:
        self._require_available(model_path)
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.log_severity_level = 3  # fallbacks are detected below, not left to ORT's warnings
        if threads:
            options.intra_op_num_threads = threads
        profile_dir = tempfile.mkdtemp(prefix="qdeploy-ort-profile-")
        options.enable_profiling = True
        options.profile_file_prefix = str(Path(profile_dir) / "run")
        provider_options, notes = self._provider_options(pin_f32)
        try:
            session = ort.InferenceSession(str(model_path), sess_options=options,
                                           providers=self.providers, provider_options=provider_options)
        except Exception as exc:
            shutil.rmtree(profile_dir, ignore_errors=True)
            raise ModelError(f"{Path(model_path).name}: onnxruntime ({self.name}) cannot load the model: "
                             f"{short_message(exc)}") from None
        used = session.get_providers()
        if not used or used[0] != self.providers[0]:
            _end_profile(session, profile_dir)
            raise TargetFellBack(
                f"target {self.name} requested; onnxruntime silently fell back to {', '.join(used)} "
                f"instead of {self.providers[0]}; refusing to report its results as {self.name}")
        return OrtSession(self.name, session, profile_dir, notes)

    def _provider_options(self, pin_f32: bool) -> tuple[list[dict[str, str]], list[str]]:
        """Options per provider in ``self.providers``, and notes on what they pin."""
        options: list[dict[str, str]] = [{} for _ in self.providers]
        notes: list[str] = []
        if self.device == "cuda" and pin_f32:
            options[0]["use_tf32"] = "0"
            notes.append("CUDA TF32 math disabled (pin_f32)")
        elif self.device == "openvino":
            options[0]["device_type"] = "CPU"
            if pin_f32:
                options[0]["precision"] = "FP32"
                notes.append("OpenVINO EP precision pinned to FP32")
        elif self.device == "tensorrt":
            options[1]["use_tf32"] = "0" if pin_f32 else "1"
            notes.append("TensorRT fp16/int8 modes off; TensorRT may still use TF32 for float32 layers")
        return options, notes


class OrtSession(Session):
    """An ONNX Runtime InferenceSession; kernel placement is read from the first run's profile."""

    def __init__(self, target: str, session: Any, profile_dir: str, notes: list[str]) -> None:
        self.target = target
        self._session = session
        self._profile_dir: str | None = profile_dir
        self.input_names = [value.name for value in session.get_inputs()]
        self.output_names = [value.name for value in session.get_outputs()]
        providers = [p for p in session.get_providers() if p not in _HIDDEN_PROVIDERS]
        self.executed = ExecutionInfo(
            target=target, runtime="onnxruntime", device=providers[0], providers=providers, precision=None,
            notes=[*notes, "node_counts are read from the profile of the first run"],
        )
        self._finalizer = weakref.finalize(self, _end_profile, session, profile_dir)

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        check_feeds(self.target, self.input_names, feeds)
        try:
            outputs = self._session.run(self.output_names, feeds)
        except Exception as exc:
            if type(exc).__name__ == "InvalidArgument":
                shapes = ", ".join(f"{name} {list(np.shape(value))}" for name, value in feeds.items())
                raise DataError(f"target {self.target}: the feeds ({shapes}) do not fit the model: "
                                f"{short_message(exc)}{_index_hint(exc)}") from None
            raise
        if self._profile_dir is not None:
            self._read_profile()
        return as_arrays(self.output_names, outputs)

    def close(self) -> None:
        self._finalizer()

    def bind(self, feeds: dict[str, np.ndarray]) -> BoundCall:
        check_feeds(self.target, self.input_names, feeds)
        return OrtBoundCall(self._session, feeds, self.output_names)

    @property
    def inference_session(self) -> Any:
        """ONNX Runtime's InferenceSession: for calls this adapter does not wrap (OrtValue binding of a decode
        step's cache)."""
        return self._session

    def runtime_settings(self) -> dict[str, Any]:
        options = self._session.get_session_options()
        return {"intra_op_num_threads": options.intra_op_num_threads or "default (one per physical core)",
                "inter_op_num_threads": options.inter_op_num_threads or "default",
                "execution_mode": str(options.execution_mode).rsplit(".", 1)[-1].lower().removeprefix("ort_"),
                "graph_optimization_level": str(options.graph_optimization_level).rsplit(".", 1)[-1]}

    def _read_profile(self) -> None:
        profile_dir, self._profile_dir = self._profile_dir, None
        try:
            events = json.loads(Path(self._session.end_profiling()).read_text())
        except (OSError, ValueError) as exc:
            self.executed.notes.append(f"node placement unknown: cannot read ORT's profile ({short_message(exc)})")
            events = []
        finally:
            shutil.rmtree(profile_dir, ignore_errors=True)
        kernels = _profile_kernels(events)
        self.executed.node_counts = dict(Counter(str(args.get("provider", "?")) for args in kernels))
        self.executed.op_types = dict(Counter(str(args.get("op_name", "?")) for args in kernels))
        self.executed.precisions = dict(Counter(_kernel_precision(args) for args in kernels))
        if self.target != "ort:cpu" and self.executed.node_counts.get("CPUExecutionProvider"):
            note = (f"{self.executed.node_counts['CPUExecutionProvider']} of {len(kernels)} kernels ran on "
                    f"CPUExecutionProvider, not {self.executed.device}")
            self.executed.notes.append(note)
            log.warning("target %s: %s", self.target, note)


def _profile_kernels(events: list[OrtProfileEvent]) -> list[OrtKernelArgs]:
    """The args of each distinct kernel of a profile; a node inside a Loop runs (and is profiled) many times."""
    kernels: dict[str, OrtKernelArgs] = {}
    for event in events:
        name = str(event.get("name", ""))
        if event.get("cat") == "Node" and name.endswith("_kernel_time"):
            kernels.setdefault(name.removesuffix("_kernel_time"), event.get("args", {}))
    return list(kernels.values())


def _kernel_precision(args: OrtKernelArgs) -> str:
    """The element type a kernel computes in: that of its first input (of its first output when it has none); an
    integer kernel fed float (DynamicQuantizeMatMul quantizes its input inside) computes in its weight's type."""
    if args.get("op_name") in INT8_ORT_OPS:
        types = [next(iter(shape)) for shape in args.get("input_type_shape") or [] if isinstance(shape, dict) and shape]
        eight_bit = next((name for name in types if name in ("int8", "uint8")), None)
        if eight_bit is not None:
            return _ORT_TYPE_NAMES[eight_bit]
    for key in ("input_type_shape", "output_type_shape"):
        shapes = args.get(key) or []
        if shapes and isinstance(shapes[0], dict) and shapes[0]:
            type_name = next(iter(shapes[0]))
            return _ORT_TYPE_NAMES.get(type_name, type_name.upper())
    return "?"


def _end_profile(session: Any, profile_dir: str) -> None:
    """Stop ORT profiling (it writes a file even for a session never run) and remove its folder."""
    try:
        session.end_profiling()
    except Exception as exc:
        log.debug("ending ORT profiling failed: %s", exc)
    shutil.rmtree(profile_dir, ignore_errors=True)


def _index_hint(exc: Exception) -> str:
    """What to do when the values, not the shapes, do not fit: an integer input indexes past a table."""
    if "out of data bounds" not in str(exc):
        return ""
    return ("; an integer input's values index past a table: give it low/high in model.inputs (seeded random "
            "data takes [0, 100) where the graph does not show the table it indexes), or feed real samples")
