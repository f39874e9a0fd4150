"""Target adapters: one per runtime, behind one small interface.

A target is named ``runtime:device`` (``ort:cpu``, ``openvino:cpu``, ...).  An
adapter says whether its target exists on this machine (``availability``) and
loads a model into a ``Session`` that runs feeds and records what really ran
(``Session.executed``).  Comparing outputs is not done here: see
``pipeline.compare``.

Nothing heavy is imported at module import time: onnxruntime, openvino and
onnx are imported by the adapter that needs them.  A target that cannot run
as asked raises ``TargetUnavailable``; it never hands back a silent substitute
(a CPU result labelled GPU, a bfloat16 result labelled float32).
"""

from __future__ import annotations

import functools
import json
import logging
import shutil
import tempfile
import weakref
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from pipeline.errors import DataError, ModelError, TargetUnavailable

log = logging.getLogger(__name__)

KNOWN_TARGETS: tuple[str, ...] = (
    "ort:cpu", "ort:cuda", "ort:tensorrt", "ort:openvino",
    "openvino:cpu", "openvino:gpu", "openvino:npu",
    "reference:cpu",
)
_ORT_PROVIDERS: dict[str, list[str]] = {
    "cpu": ["CPUExecutionProvider"],
    "cuda": ["CUDAExecutionProvider", "CPUExecutionProvider"],
    "tensorrt": ["TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"],
    "openvino": ["OpenVINOExecutionProvider", "CPUExecutionProvider"],
}
_HIDDEN_PROVIDERS = frozenset({"AzureExecutionProvider"})
_OV_PRECISION_NAMES = {"f32": "FP32", "f16": "FP16", "bf16": "BF16", "f64": "FP64"}
_OV_BOOKKEEPING_LAYERS = frozenset({"Input", "Output", "Const"})
_MAX_MESSAGE = 400


@dataclass
class ExecutionInfo:
    """What really ran; JSON-serialisable through ``to_dict``.

    ``node_counts``: ORT: kernels per execution provider, read from the profile
    of the session's first run (empty until then); OpenVINO: compute layers of
    the runtime model per runtime precision, named "FP32", "BF16", "FP16",
    "I8", "U8", ...  (inputs, outputs and constants are not counted).
    ``op_types``: ORT: kernels per op type of the first run (e.g. "QLinearConv");
    OpenVINO: runtime layers per layer type; reference: nodes per op type.
    """

    target: str
    runtime: str
    device: str
    providers: list[str]
    precision: str | None
    node_counts: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    op_types: dict[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class Session:
    """A loaded model on one target: ``run(feeds) -> outputs by ONNX output name``."""

    target: str
    input_names: list[str]
    output_names: list[str]
    executed: ExecutionInfo

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        raise NotImplementedError

    def close(self) -> None:
        """Release what the session holds; the default holds nothing extra."""

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class TargetAdapter:
    """One runtime's way to check, load and run models on one device."""

    runtime: ClassVar[str] = ""
    benchmarkable: ClassVar[bool] = True

    def __init__(self, name: str) -> None:
        self.name = name
        self.device = name.split(":", 1)[1]

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"

    def availability(self) -> tuple[bool, str]:
        """(True, "") when the target can run here, else (False, reason). Never raises."""
        raise NotImplementedError

    def load(self, model_path: Path, *, threads: int | None = None, pin_f32: bool = True) -> Session:
        raise NotImplementedError

    def _require_available(self, model_path: Path) -> None:
        ok, reason = self.availability()
        if not ok:
            raise TargetUnavailable(reason)
        if not Path(model_path).is_file():
            raise ModelError(f"model file not found: {model_path}")


def get_target(name: str) -> TargetAdapter:
    """The adapter of a target name; ValueError naming the known targets for an unknown one."""
    if name not in KNOWN_TARGETS:
        raise ValueError(f"unknown target '{name}'; known targets: {', '.join(KNOWN_TARGETS)}")
    runtime = name.split(":", 1)[0]
    adapter_class = {"ort": OrtTarget, "openvino": OpenVinoTarget, "reference": ReferenceTarget}[runtime]
    return adapter_class(name)


def available_targets() -> dict[str, str]:
    """Every known target -> "" when available here, else the reason it is not."""
    result = {}
    for name in KNOWN_TARGETS:
        try:
            ok, reason = get_target(name).availability()
        except Exception as exc:  # availability must never raise; belt and braces for `qdeploy doctor`
            ok, reason = False, f"target {name}: availability check failed: {_short(exc)}"
        result[name] = "" if ok else reason
    return result


def _short(exc: BaseException) -> str:
    """An exception's message on one line, cut to a readable length."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= _MAX_MESSAGE else text[: _MAX_MESSAGE - 3] + "..."


def _check_feeds(target: str, input_names: list[str], feeds: dict[str, np.ndarray]) -> None:
    missing = [name for name in input_names if name not in feeds]
    unknown = sorted(set(feeds) - set(input_names))
    if missing or unknown:
        raise DataError(f"target {target}: feeds {sorted(feeds)} do not match the model inputs {input_names}"
                        f" (missing {missing}, unknown {unknown})")


def _onnx_io_names(model_path: Path) -> tuple[list[str], list[str]]:
    """Real input names (initializers excluded) and output names as the ONNX graph declares them."""
    import onnx

    try:
        model = onnx.load(str(model_path), load_external_data=False)
    except Exception as exc:
        raise ModelError(f"{Path(model_path).name}: not a readable ONNX model: {_short(exc)}") from None
    initializers = {init.name for init in model.graph.initializer}
    inputs = [value.name for value in model.graph.input if value.name not in initializers]
    return inputs, [value.name for value in model.graph.output]


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
            return False, (f"target {self.name} requested; onnxruntime is not installed "
                           "(pip install onnxruntime, or onnxruntime-gpu for CUDA/TensorRT)")
        try:
            existing = [p for p in onnxruntime.get_available_providers() if p not in _HIDDEN_PROVIDERS]
        except Exception as exc:
            return False, f"target {self.name} requested; onnxruntime cannot list its providers: {_short(exc)}"
        if self.providers[0] in existing:
            return True, ""
        return False, f"target {self.name} requested; this machine's onnxruntime has {', '.join(existing)}"

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
                             f"{_short(exc)}") from None
        used = session.get_providers()
        if not used or used[0] != self.providers[0]:
            _end_profile(session, profile_dir)
            raise TargetUnavailable(
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
        _check_feeds(self.target, self.input_names, feeds)
        try:
            outputs = self._session.run(self.output_names, feeds)
        except Exception as exc:
            if type(exc).__name__ == "InvalidArgument":
                raise DataError(f"target {self.target}: the feeds do not fit the model: {_short(exc)}") from None
            raise
        if self._profile_dir is not None:
            self._read_profile()
        return {name: np.asarray(value) for name, value in zip(self.output_names, outputs, strict=True)}

    def close(self) -> None:
        self._finalizer()

    def _read_profile(self) -> None:
        profile_dir, self._profile_dir = self._profile_dir, None
        try:
            events = json.loads(Path(self._session.end_profiling()).read_text())
        except (OSError, ValueError) as exc:
            self.executed.notes.append(f"node placement unknown: cannot read ORT's profile ({_short(exc)})")
            events = []
        finally:
            shutil.rmtree(profile_dir, ignore_errors=True)
        kernels = [event.get("args", {}) for event in events
                   if event.get("cat") == "Node" and str(event.get("name", "")).endswith("_kernel_time")]
        self.executed.node_counts = dict(Counter(str(args.get("provider", "?")) for args in kernels))
        self.executed.op_types = dict(Counter(str(args.get("op_name", "?")) for args in kernels))
        if self.target != "ort:cpu" and self.executed.node_counts.get("CPUExecutionProvider"):
            note = (f"{self.executed.node_counts['CPUExecutionProvider']} of {len(kernels)} kernels ran on "
                    f"CPUExecutionProvider, not {self.executed.device}")
            self.executed.notes.append(note)
            log.warning("target %s: %s", self.target, note)


def _end_profile(session: Any, profile_dir: str) -> None:
    """Stop ORT profiling (it writes a file even for a session never run) and remove its folder."""
    try:
        session.end_profiling()
    except Exception as exc:
        log.debug("ending ORT profiling failed: %s", exc)
    shutil.rmtree(profile_dir, ignore_errors=True)


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
            return False, f"target {self.name} requested; openvino is not installed (pip install openvino)"
        except Exception as exc:
            return False, f"target {self.name} requested; OpenVINO cannot list its devices: {_short(exc)}"
        if any(d == self.ov_device or d.startswith(self.ov_device + ".") for d in devices):
            return True, ""
        existing = ", ".join(devices) or "none"
        return False, f"target {self.name} requested; this machine's OpenVINO has devices {existing}"

    def load(self, model_path: Path, *, threads: int | None = None, pin_f32: bool = True) -> Session:
        self._require_available(model_path)
        core = _ov_core()
        input_names, output_names = _onnx_io_names(model_path)
        try:
            model = core.read_model(str(model_path))
        except Exception as exc:
            raise ModelError(f"{Path(model_path).name}: OpenVINO cannot read the model: {_short(exc)}") from None
        support_note = self._query_support(model)
        config, notes = self._compile_config(threads, pin_f32)
        try:
            compiled = core.compile_model(model, self.ov_device, config)
        except Exception as exc:
            raise ModelError(f"{Path(model_path).name}: OpenVINO cannot compile the model for {self.ov_device} "
                             f"({support_note}): {_short(exc)}") from None
        return OpenVinoSession(self.name, compiled, input_names, output_names, [support_note, *notes])

    def _query_support(self, model: Any) -> str:
        """A note on how many of the model's ops the device supports, naming a few it does not."""
        try:
            supported = set(_ov_core().query_model(model, self.ov_device))
        except Exception as exc:
            return f"query_model failed on {self.ov_device}: {_short(exc)}"
        ops = [op for op in model.get_ops() if op.get_type_name() not in ("Parameter", "Result", "Constant")]
        unsupported = [f"{op.get_friendly_name()} ({op.get_type_name()})" for op in ops
                       if op.get_friendly_name() not in supported]
        if not unsupported:
            return f"query_model: all {len(ops)} ops supported on {self.ov_device}"
        return (f"query_model: {len(unsupported)} of {len(ops)} ops unsupported on {self.ov_device}: "
                f"{', '.join(unsupported[:5])}{' ...' if len(unsupported) > 5 else ''}")

    def _compile_config(self, threads: int | None, pin_f32: bool) -> tuple[dict[str, Any], list[str]]:
        """Compile properties the device supports, and notes on what could not be set."""
        try:
            supported = set(_ov_core().get_property(self.ov_device, "SUPPORTED_PROPERTIES"))
        except Exception:
            supported = {"INFERENCE_PRECISION_HINT", "INFERENCE_NUM_THREADS"}
        config: dict[str, Any] = {}
        notes: list[str] = []
        wanted: dict[str, Any] = {}
        if pin_f32:
            wanted["INFERENCE_PRECISION_HINT"] = "f32"
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
        _check_feeds(self.target, self.input_names, feeds)
        inputs = {self._input_ports[name]: np.asarray(feeds[name]) for name in self.input_names}
        try:
            results = self._request.infer(inputs, share_outputs=False)
        except Exception as exc:
            raise RuntimeError(f"target {self.target}: OpenVINO inference failed: {_short(exc)}") from exc
        return {name: np.array(results[self._output_ports[name]], copy=True) for name in self.output_names}


def _match_ports(ports: Any, onnx_names: list[str], kind: str) -> dict[str, int]:
    """ONNX name -> port index; a port may carry several tensor names, so match on the set."""
    by_name: dict[str, int] = {}
    for index, port in enumerate(ports):
        for name in port.get_names():
            by_name.setdefault(name, index)
    missing = [name for name in onnx_names if name not in by_name]
    if missing:
        raise ModelError(f"OpenVINO's compiled model has no {kind} named {missing}; "
                         f"its {kind}s are {[sorted(port.get_names()) for port in ports]}")
    return {name: by_name[name] for name in onnx_names}


def _ov_execution_info(target: str, compiled: Any, notes: list[str]) -> ExecutionInfo:
    notes = list(notes)
    try:
        hint = compiled.get_property("INFERENCE_PRECISION_HINT")
        precision: str | None = hint.get_type_name() if hasattr(hint, "get_type_name") else str(hint)
    except Exception as exc:
        precision = None
        notes.append(f"inference precision unknown: {_short(exc)}")
    try:
        devices = [str(d) for d in compiled.get_property("EXECUTION_DEVICES")]
    except Exception:
        devices = [target.split(":", 1)[1].upper()]
    node_counts, op_types = _ov_runtime_counts(compiled, notes)
    return ExecutionInfo(target=target, runtime="openvino", device=devices[0], providers=devices,
                         precision=precision, node_counts=node_counts, notes=notes, op_types=op_types)


def _ov_runtime_counts(compiled: Any, notes: list[str]) -> tuple[dict[str, int], dict[str, int]]:
    """Compute layers of the runtime model per runtime precision and per layer type."""
    precisions: Counter[str] = Counter()
    layers: Counter[str] = Counter()
    try:
        ops = compiled.get_runtime_model().get_ops()
    except Exception as exc:
        notes.append(f"runtime model unavailable: {_short(exc)}")
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


class ReferenceTarget(TargetAdapter):
    """onnx.reference.ReferenceEvaluator: every op in its declared precision; fidelity only."""

    runtime = "onnx-reference"
    benchmarkable = False

    def availability(self) -> tuple[bool, str]:
        try:
            import onnx.reference  # noqa: F401
        except ImportError as exc:
            return False, f"target {self.name} requested; onnx.reference cannot be imported: {_short(exc)}"
        return True, ""

    def load(self, model_path: Path, *, threads: int | None = None, pin_f32: bool = True) -> Session:
        self._require_available(model_path)
        import onnx
        from onnx.reference import ReferenceEvaluator

        try:
            model = onnx.load(str(model_path))
            evaluator = ReferenceEvaluator(model)
        except Exception as exc:
            raise ModelError(f"{Path(model_path).name}: onnx.reference cannot load the model: "
                             f"{_short(exc)}") from None
        return ReferenceSession(self.name, evaluator, model, threads)


class ReferenceSession(Session):
    """A ReferenceEvaluator; slow, exact to each op's declared precision."""

    def __init__(self, target: str, evaluator: Any, model: Any, threads: int | None) -> None:
        self.target = target
        self._evaluator = evaluator
        initializers = {init.name for init in model.graph.initializer}
        self.input_names = [value.name for value in model.graph.input if value.name not in initializers]
        self.output_names = [value.name for value in model.graph.output]
        notes = ["every op computed in its declared precision by onnx.reference"]
        if threads:
            notes.append(f"threads={threads} ignored: onnx.reference runs single-threaded numpy")
        self.executed = ExecutionInfo(
            target=target, runtime="onnx-reference", device="CPU", providers=["ReferenceEvaluator"],
            precision="declared", node_counts={"ReferenceEvaluator": len(model.graph.node)}, notes=notes,
            op_types=dict(Counter(node.op_type for node in model.graph.node)),
        )

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        _check_feeds(self.target, self.input_names, feeds)
        outputs = self._evaluator.run(None, dict(feeds))
        return {name: np.asarray(value) for name, value in zip(self.output_names, outputs, strict=True)}
