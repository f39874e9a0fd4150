"""The OpenVINO target adapter (``openvino:cpu``, ``openvino:gpu``, ``openvino:npu``).

OpenVINO reads the ONNX file itself; ``query_model`` is asked which ops the
device supports before compiling (a search trial skips it unless compiling fails: it costs about as much as the
compile, and the CPU and GPU plugins refuse to compile what they do not support).  The inference precision is a
setting: ``precision`` pins INFERENCE_PRECISION_HINT ('f32', 'f16', 'bf16'); without it,
``pin_f32`` (the default, what float32 artifacts get) pins f32, and
``pin_f32=False`` leaves the device default (bfloat16 on CPUs with AVX512-BF16
or AMX: see ``qdeploy.targets.cpu_facts``); a pinned f32 also turns off the dynamic quantization of activations
before MatMuls of compressed weights (``DYNAMIC_QUANTIZATION``).  OpenVINO ignores a hint the device
cannot honour, so the precision that really ran is read back from the compiled
model and from its runtime model's layers, and a hint that did not hold is noted; a compiled hint naming a
precision the device's OPTIMIZATION_CAPABILITIES lack is reported as f32 (an NVIDIA GPU through PoCL's OpenCL
reads f16 and runs f32), and a float16 model such a device cannot compile is ``TargetUnavailable`` there.
A model OpenVINO's ONNX frontend refuses as written but reads after an exact
rewrite is read rewritten (``qdeploy.targets.openvino_read``), and the notes of
what ran say so.
"""

from __future__ import annotations

import functools
import logging
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from qdeploy.core.errors import ModelError, TargetUnavailable
from qdeploy.targets.base import (
    ExecutionInfo,
    Session,
    TargetAdapter,
    check_feeds,
    not_here,
    onnx_io_names,
    short_message,
)
from qdeploy.targets.bound import BoundCall
from qdeploy.targets.openvino_probe import compile_crash
from qdeploy.targets.openvino_read import read_onnx

__all__ = ["PINNABLE", "OpenVinoBoundCall", "OpenVinoSession", "OpenVinoTarget"]

log = logging.getLogger(__name__)

_OV_PRECISION_NAMES = {"f32": "FP32", "f16": "FP16", "bf16": "BF16", "f64": "FP64"}
_OV_BOOKKEEPING_LAYERS = frozenset({"Input", "Output", "Const"})
PINNABLE = ("f32", "f16", "bf16")
"""INFERENCE_PRECISION_HINT values ``load(precision=...)`` pins."""
DYNAMIC_QUANTIZATION = "DYNAMIC_QUANTIZATION_GROUP_SIZE"
"""OpenVINO's CPU plugin quantizes activations to int8 in groups of 32 before a MatMul of compressed (int8, int4)
weights, at f32 too (a MiniLM with int8 weights: 31 dB against ONNX Runtime pinned to f32, 117 dB with 0): a
pinned f32 sets 0, so float32 math is float32 math."""
NOT_QUERIED = "query_model not asked (a search trial; the compile succeeded)"
_OV_SHORT = {"float32": "f32", "f32": "f32", "bfloat16": "bf16", "bf16": "bf16", "float16": "f16", "f16": "f16"}


@functools.cache
def _ov_core() -> Any:
    """One OpenVINO Core per process: creating it is slow."""
    import openvino

    return openvino.Core()


class OpenVinoTarget(TargetAdapter):
    """OpenVINO reading the ONNX file directly and compiling it for one device."""

    runtime = "openvino"

    @property
    def ov_device(self) -> str:
        return self.device.upper()

    def availability(self) -> tuple[bool, str]:
        try:
            devices = list(_ov_core().available_devices)
        except ImportError:
            return False, not_here(self.name, "openvino is not installed (pip install openvino)")
        except Exception as exc:
            return False, not_here(self.name, f"OpenVINO cannot list its devices: {short_message(exc)}")
        if any(d == self.ov_device or d.startswith(self.ov_device + ".") for d in devices):
            return True, ""
        existing = ", ".join(devices) or "none"
        return False, not_here(self.name, f"this machine's OpenVINO has devices {existing}")

    def load(self, model_path: Path, *, threads: int | None = None, pin_f32: bool = True,
             precision: str | None = None, query_support: bool = True) -> Session:
        """Compile for the device.  ``precision`` ('f32', 'f16', 'bf16') pins INFERENCE_PRECISION_HINT and wins over
        ``pin_f32``; with neither, the device's default precision runs.  ``session.requested_precision`` is the hint
        asked for (None: the default), ``session.executed.precision`` what OpenVINO compiled.
        ``query_support=False`` (a search's trial, never a reported row) asks ``query_model`` only to explain a
        failed compile."""
        self._require_available(model_path)
        crash = compile_crash(Path(model_path)) if self.ov_device.startswith("CPU") else None
        if crash is not None:  # compiled here, it would end the run
            raise ModelError(f"{Path(model_path).name}: {crash}")
        core = _ov_core()
        input_names, output_names = onnx_io_names(model_path)
        try:
            model, read_notes = read_onnx(core, model_path)
        except Exception as exc:
            raise ModelError(f"{Path(model_path).name}: OpenVINO cannot read the model: {short_message(exc)}") from None
        support_note, unsupported = self._query_support(model) if query_support else (NOT_QUERIED, [])
        config, notes = self._compile_config(threads, pin_f32, precision)
        notes = [*read_notes, *notes]
        try:
            compiled = core.compile_model(model, self.ov_device, config)
        except Exception as exc:
            self.refuse_missing_float16(model, model_path, exc)
            if not query_support:
                support_note = self._query_support(model)[0]
            raise ModelError(f"{Path(model_path).name}: OpenVINO cannot compile the model for {self.ov_device} "
                             f"({support_note}): {short_message(exc)}") from None
        session = OpenVinoSession(self.name, compiled, input_names, output_names, [support_note, *notes])
        session.executed.unsupported_ops = unsupported
        session.requested_precision = config.get("INFERENCE_PRECISION_HINT")
        _note_ignored_hint(self.name, session.requested_precision, session.executed)
        return session

    def refuse_missing_float16(self, model: Any, model_path: Path, exc: Exception) -> None:
        """A float16 model that failed to compile on a device without float16 kernels (OPTIMIZATION_CAPABILITIES
        without FP16: an NVIDIA GPU through PoCL's OpenCL) is a fact of the machine, like a missing device, not a
        defect of the artifact: TargetUnavailable, with OpenVINO's own message."""
        capabilities = device_capabilities(self.ov_device)
        if not capabilities or "FP16" in capabilities or not _has_float16(model):
            return
        try:
            name = f" ({_ov_core().get_property(self.ov_device, 'FULL_DEVICE_NAME')})"
        except Exception:
            name = ""
        raise TargetUnavailable(
            f"{self.name}{name} has no float16 kernels (OPTIMIZATION_CAPABILITIES {', '.join(sorted(capabilities))})"
            f": {Path(model_path).name} holds float16 tensors and cannot run there; deploy a float32 or int8 "
            f"variant on it (OpenVINO: {short_message(exc)})") from None

    def _query_support(self, model: Any) -> tuple[str, list[str]]:
        """Asked before compiling: a note on how many ops the device supports, and those it does not."""
        try:
            supported = set(_ov_core().query_model(model, self.ov_device))
        except Exception as exc:
            return f"query_model failed on {self.ov_device}: {short_message(exc)}", []
        ops = [op for op in model.get_ops() if op.get_type_name() not in ("Parameter", "Result", "Constant")]
        unsupported = [f"{op.get_friendly_name()} ({op.get_type_name()})" for op in ops
                       if op.get_friendly_name() not in supported]
        if not unsupported:
            return f"query_model: all {len(ops)} ops supported on {self.ov_device}", []
        note = (f"query_model: {len(unsupported)} of {len(ops)} ops unsupported on {self.ov_device}: "
                f"{', '.join(unsupported[:5])}{' ...' if len(unsupported) > 5 else ''}")
        log.warning("target %s: %s", self.name, note)
        return note, unsupported

    def _compile_config(self, threads: int | None, pin_f32: bool,
                        precision: str | None = None) -> tuple[dict[str, str | int], list[str]]:
        """Compile properties the device supports, and notes on what could not be set."""
        if precision is not None and precision not in PINNABLE:
            raise ValueError(f"target {self.name}: inference precision '{precision}' is not one of {PINNABLE}")
        try:
            supported = set(_ov_core().get_property(self.ov_device, "SUPPORTED_PROPERTIES"))
        except Exception:
            supported = {"INFERENCE_PRECISION_HINT", "INFERENCE_NUM_THREADS"}
        config: dict[str, str | int] = {}
        notes: list[str] = []
        wanted: dict[str, str | int] = {}
        if precision is not None or pin_f32:
            wanted["INFERENCE_PRECISION_HINT"] = precision or "f32"
        if wanted.get("INFERENCE_PRECISION_HINT") == "f32" and DYNAMIC_QUANTIZATION in supported:
            config[DYNAMIC_QUANTIZATION] = 0  # float32 activations: no int8 ones for weight-compressed MatMuls
        if threads:
            wanted["INFERENCE_NUM_THREADS"] = int(threads)
        for key, value in wanted.items():
            if key in supported:
                config[key] = value
            else:
                notes.append(f"{self.ov_device} does not support {key}; {key}={value} not applied")
                log.warning("target %s: %s does not support %s", self.name, self.ov_device, key)
        return config, notes


class OpenVinoSession(Session):
    """A compiled OpenVINO model with one InferRequest; outputs keyed by ONNX output names."""

    requested_precision: str | None = None
    """The INFERENCE_PRECISION_HINT asked for; None: the device's default."""

    def __init__(self, target: str, compiled: Any, input_names: list[str], output_names: list[str],
                 notes: list[str]) -> None:
        self.target = target
        self._compiled = compiled
        self._request = compiled.create_infer_request()
        self.input_names = input_names
        self._input_ports = _match_ports(compiled.inputs, input_names, "input")
        self._output_ports = _match_ports(compiled.outputs, output_names, "output")
        self.output_names = list(output_names)
        self.executed = _ov_execution_info(target, compiled, notes)

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        check_feeds(self.target, self.input_names, feeds)
        inputs = {self._input_ports[name]: np.asarray(feeds[name]) for name in self.input_names}
        try:
            results = self._request.infer(inputs, share_outputs=False)
        except Exception as exc:
            raise RuntimeError(f"target {self.target}: OpenVINO inference failed: {short_message(exc)}") from exc
        return {name: np.array(results[self._output_ports[name]], copy=True) for name in self.output_names}

    def bind(self, feeds: dict[str, np.ndarray]) -> BoundCall:
        check_feeds(self.target, self.input_names, feeds)
        return OpenVinoBoundCall(self._request, {self._input_ports[name]: feeds[name] for name in self.input_names},
                                 self._output_ports)

    @property
    def compiled_model(self) -> Any:
        """OpenVINO's CompiledModel: its runtime model names the original layers each executed layer fused."""
        return self._compiled

    def runtime_settings(self) -> dict[str, Any]:
        settings: dict[str, Any] = {}
        for key in _READ_BACK_PROPERTIES:
            try:
                settings[key] = _plain(self._compiled.get_property(key))
            except Exception:  # not every device has every property
                continue
        return settings


_READ_BACK_PROPERTIES = ("PERFORMANCE_HINT", "NUM_STREAMS", "INFERENCE_NUM_THREADS", "INFERENCE_PRECISION_HINT",
                         "OPTIMAL_NUMBER_OF_INFER_REQUESTS", "ENABLE_CPU_PINNING", DYNAMIC_QUANTIZATION)


class OpenVinoBoundCall(BoundCall):
    """``InferRequest.infer()`` on input tensors set once; outputs read from the request after each run."""

    description = "InferRequest.infer() on input tensors set once"

    def __init__(self, request: Any, feeds_by_port: dict[int, np.ndarray], output_ports: dict[str, int]) -> None:
        import openvino

        self._request = request
        self._ports = output_ports
        self._inputs = {index: np.ascontiguousarray(value) for index, value in feeds_by_port.items()}  # kept alive
        for index, value in self._inputs.items():
            request.set_input_tensor(index, openvino.Tensor(value))

    def run(self) -> None:
        self._request.infer()

    def outputs(self) -> dict[str, np.ndarray]:
        return {name: np.array(self._request.get_output_tensor(index).data) for name, index in self._ports.items()}


def _note_ignored_hint(target: str, requested: str | None, executed: ExecutionInfo) -> None:
    """OpenVINO compiles at another precision, silently, when the device cannot run the one asked for."""
    if requested is None or executed.precision is None or _OV_SHORT.get(executed.precision) == requested:
        return
    note = (f"INFERENCE_PRECISION_HINT {requested} asked; OpenVINO compiled {executed.precision}: the device cannot "
            f"run {requested} (OpenVINO ignores a hint it cannot honour)")
    log.warning("target %s: %s", target, note)
    executed.notes.append(note)


def _plain(value: Any) -> Any:
    """An OpenVINO property value as JSON: numbers and booleans as they are, enums and types by name."""
    if isinstance(value, bool | int | float | str):
        return value
    if hasattr(value, "get_type_name"):
        return value.get_type_name()
    return str(value).rsplit(".", 1)[-1]


def _match_ports(ports: Any, onnx_names: list[str], kind: str) -> dict[str, int]:
    """ONNX name -> port index; a port may carry several tensor names, so match on the set."""
    by_name: dict[str, int] = {}
    for index, port in enumerate(ports):
        for name in port.get_names():
            by_name.setdefault(name, index)
    missing = [name for name in onnx_names if name not in by_name]
    if missing:  # a model exposing its intermediates has thousands of ports: name a few of each
        listed = [sorted(port.get_names()) for port in ports]
        raise ModelError(f"OpenVINO's compiled model has no {kind} named {_few(missing)} ({len(missing)} missing); "
                         f"its {len(listed)} {kind}s are {_few(listed)}")
    return {name: by_name[name] for name in onnx_names}


def _few(items: list[Any], shown: int = 5) -> str:
    return f"{items[:shown]}{' ...' if len(items) > shown else ''}"


def _ov_execution_info(target: str, compiled: Any, notes: list[str]) -> ExecutionInfo:
    notes = list(notes)
    try:
        hint = compiled.get_property("INFERENCE_PRECISION_HINT")
        precision: str | None = hint.get_type_name() if hasattr(hint, "get_type_name") else str(hint)
    except Exception as exc:
        precision = None
        notes.append(f"inference precision unknown: {short_message(exc)}")
    try:
        devices = [str(d) for d in compiled.get_property("EXECUTION_DEVICES")]
    except Exception:
        devices = [target.split(":", 1)[1].upper()]
    node_counts, op_types = _ov_runtime_counts(compiled, notes)
    precision = _capable_precision(devices[0], precision, node_counts, notes)
    return ExecutionInfo(target=target, runtime="openvino", device=devices[0], providers=devices,
                         precision=precision, node_counts=node_counts, notes=notes, op_types=op_types,
                         precisions=dict(node_counts))


_CAPABILITY = {"f16": "FP16", "bf16": "BF16"}


def _has_float16(model: Any) -> bool:
    """Any float16 tensor in an OpenVINO model (weights, activations, inputs or outputs)."""
    import openvino

    return any(output.get_element_type() == openvino.Type.f16 for op in model.get_ops() for output in op.outputs())


def lacks_kernels(precision: str | None, capabilities: set[str] | None) -> bool:
    """A reduced precision ('f16', 'bf16') that a device's known, non-empty OPTIMIZATION_CAPABILITIES do not list:
    OpenVINO reports it as the hint, yet runs f32."""
    return precision in _CAPABILITY and bool(capabilities) and _CAPABILITY[precision] not in capabilities


def device_capabilities(device: str) -> set[str] | None:
    """OpenVINO's OPTIMIZATION_CAPABILITIES of ``device`` ('FP32', 'FP16', 'BF16', 'INT8'...); None if unknown."""
    try:
        return {str(item).upper() for item in _ov_core().get_property(device.split(".")[0],
                                                                       "OPTIMIZATION_CAPABILITIES")}
    except Exception:  # an old OpenVINO or a device that answers nothing: no claim either way
        return None


def _capable_precision(device: str, precision: str | None, node_counts: dict[str, int], notes: list[str]) -> str | None:
    """The float precision that really ran: a compiled model's INFERENCE_PRECISION_HINT reads 'f16' on a GPU
    without float16 kernels (an NVIDIA GPU through PoCL's OpenCL: capabilities FP32, BIN, INT8) while every layer
    runs in f32, so a reduced hint the device's capabilities do not list is reported as f32."""
    short = _OV_SHORT.get(str(precision))
    capabilities = device_capabilities(device) if short in _CAPABILITY else None
    if not lacks_kernels(short, capabilities):
        return precision
    layers = ", ".join(f"{name} {count}" for name, count in sorted(node_counts.items())) or "none read"
    notes.append(f"INFERENCE_PRECISION_HINT reads {short}, but {device}'s OPTIMIZATION_CAPABILITIES "
                 f"({', '.join(sorted(capabilities))}) have no {_CAPABILITY[short]}: its float layers run in f32 "
                 f"(runtime model layers: {layers})")
    return "f32"


def _ov_runtime_counts(compiled: Any, notes: list[str]) -> tuple[dict[str, int], dict[str, int]]:
    """Compute layers of the runtime model per runtime precision and per layer type."""
    precisions: Counter[str] = Counter()
    layers: Counter[str] = Counter()
    try:
        ops = compiled.get_runtime_model().get_ops()
    except Exception as exc:
        notes.append(f"runtime model unavailable: {short_message(exc)}")
        return {}, {}
    for op in ops:
        info = op.get_rt_info()
        layer = info["layerType"].astype(str) if "layerType" in info else op.get_type_name()
        if layer in _OV_BOOKKEEPING_LAYERS:
            continue
        layers[layer] += 1
        if "runtimePrecision" in info:
            raw = info["runtimePrecision"].astype(str)
            precisions[_OV_PRECISION_NAMES.get(raw, raw.upper())] += 1
    return dict(precisions), dict(layers)
