"""Target adapters: one per runtime, behind one small interface.

A target is named ``runtime:device`` (``ort:cpu``, ``openvino:cpu``, ...).  An
adapter says whether its target exists on this machine (``availability``) and
loads a model into a ``Session`` that runs feeds and records what really ran
(``Session.executed``).  Comparing outputs is not done here: see
``pipeline.compare``.

Nothing heavy is imported at module import time: onnxruntime, openvino and
onnx are imported by the adapter that needs them.  A target that does not exist
here raises ``TargetUnavailable``; one that exists but ran the model elsewhere
(a GPU provider that fell back to CPU) raises ``TargetFellBack``.  Neither
hands back a silent substitute (a CPU result labelled GPU, a bfloat16 result
labelled float32).  The OpenVINO adapter lives in ``pipeline.targets_openvino``.
"""

from __future__ import annotations

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
from pipeline.reference_evaluator import EvaluatorCannotRun, build_evaluator, run_evaluator
from pipeline.targets_bound import BoundCall, OrtBoundCall

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
# ORT profile type names -> the precision names OpenVINO's runtime model uses, so both read alike.
_ORT_TYPE_NAMES = {"float": "FP32", "float16": "FP16", "bfloat16": "BF16", "double": "FP64", "int8": "I8",
                   "uint8": "U8", "int16": "I16", "uint16": "U16", "int32": "I32", "int64": "I64", "bool": "BOOL"}
_MAX_MESSAGE = 400


class TargetFellBack(TargetUnavailable):
    """The target exists but the runtime ran the model elsewhere (e.g. CUDA fell back to the CPU provider).

    A failure of that target, not a missing one: validation reports it as ``failed``.  It derives from
    ``TargetUnavailable`` so that callers that only know that class still never report a substitute.
    """


@dataclass
class ExecutionInfo:
    """What really ran; JSON-serialisable through ``to_dict``.

    ``node_counts``: ORT: distinct kernels (nodes of the optimized graph) per
    execution provider, read from the profile of the session's first run (empty
    until then); OpenVINO: compute layers of the runtime model per runtime
    precision, named "FP32", "BF16", "FP16", "I8", "U8", ...  (inputs, outputs
    and constants are not counted); reference: nodes.
    ``op_types``: ORT: kernels per op type of the first run (e.g. "QLinearConv");
    OpenVINO: runtime layers per layer type; reference: nodes per op type.
    ``precisions``: what the compute ran in, in OpenVINO's names: ORT: kernels
    per element type of their first input (an fp16 graph on ORT's CPU provider
    shows "FP32" where ORT inserted casts around ops it has no fp16 kernel for);
    OpenVINO: layers per runtime precision; reference: empty (declared types).
    ``unsupported_ops``: OpenVINO: ops ``query_model`` says the device lacks.
    """

    target: str
    runtime: str
    device: str
    providers: list[str]
    precision: str | None
    node_counts: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    op_types: dict[str, int] = field(default_factory=dict)
    precisions: dict[str, int] = field(default_factory=dict)
    unsupported_ops: list[str] = field(default_factory=list)

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

    def bind(self, feeds: dict[str, np.ndarray]) -> BoundCall:
        """The call with `feeds` bound once, for timing; see ``BoundCall``."""
        check_feeds(self.target, self.input_names, feeds)
        return BoundCall(self, feeds)

    def runtime_settings(self) -> dict[str, Any]:
        """Threads, streams and hints the runtime really uses, read back from the loaded model; {} when unknown."""
        return {}

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
    if runtime == "openvino":
        from pipeline.targets_openvino import OpenVinoTarget

        return OpenVinoTarget(name)
    return {"ort": OrtTarget, "reference": ReferenceTarget}[runtime](name)


def available_targets() -> dict[str, str]:
    """Every known target -> "" when available here, else the reason it is not."""
    result = {}
    for name in KNOWN_TARGETS:
        try:
            ok, reason = get_target(name).availability()
        except Exception as exc:  # availability must never raise; belt and braces for `qdeploy doctor`
            ok, reason = False, f"target {name}: availability check failed: {short_message(exc)}"
        result[name] = "" if ok else reason
    return result


def short_message(exc: BaseException) -> str:
    """An exception's message on one line, cut to a readable length."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= _MAX_MESSAGE else text[: _MAX_MESSAGE - 3] + "..."


def check_feeds(target: str, input_names: list[str], feeds: dict[str, np.ndarray]) -> None:
    missing = [name for name in input_names if name not in feeds]
    unknown = sorted(set(feeds) - set(input_names))
    if missing or unknown:
        raise DataError(f"target {target}: feeds {sorted(feeds)} do not match the model inputs {input_names}"
                        f" (missing {missing}, unknown {unknown})")


def onnx_io_names(model_path: Path) -> tuple[list[str], list[str]]:
    """Real input names (initializers excluded) and output names as the ONNX graph declares them."""
    import onnx

    try:
        model = onnx.load(str(model_path), load_external_data=False)
    except Exception as exc:
        raise ModelError(f"{Path(model_path).name}: not a readable ONNX model: {short_message(exc)}") from None
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
            return False, f"target {self.name} requested; onnxruntime cannot list its providers: {short_message(exc)}"
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
                raise DataError(f"target {self.target}: the feeds do not fit the model: {short_message(exc)}") from None
            raise
        if self._profile_dir is not None:
            self._read_profile()
        return {name: np.asarray(value) for name, value in zip(self.output_names, outputs, strict=True)}

    def close(self) -> None:
        self._finalizer()

    def bind(self, feeds: dict[str, np.ndarray]) -> BoundCall:
        check_feeds(self.target, self.input_names, feeds)
        return OrtBoundCall(self._session, feeds, self.output_names)

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


def _profile_kernels(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The args of each distinct kernel of a profile; a node inside a Loop runs (and is profiled) many times."""
    kernels: dict[str, dict[str, Any]] = {}
    for event in events:
        name = str(event.get("name", ""))
        if event.get("cat") == "Node" and name.endswith("_kernel_time"):
            kernels.setdefault(name.removesuffix("_kernel_time"), event.get("args", {}))
    return list(kernels.values())


def _kernel_precision(args: dict[str, Any]) -> str:
    """The element type a kernel computes in: that of its first input (of its first output when it has none)."""
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


class ReferenceTarget(TargetAdapter):
    """onnx.reference.ReferenceEvaluator: every op in its declared precision; fidelity only."""

    runtime = "onnx-reference"
    benchmarkable = False

    def availability(self) -> tuple[bool, str]:
        try:
            import onnx.reference  # noqa: F401
        except ImportError as exc:
            return False, f"target {self.name} requested; onnx.reference cannot be imported: {short_message(exc)}"
        return True, ""

    def load(self, model_path: Path, *, threads: int | None = None, pin_f32: bool = True) -> Session:
        self._require_available(model_path)
        import onnx

        try:
            model = onnx.load(str(model_path))
            evaluator = build_evaluator(model)
        except EvaluatorCannotRun:
            raise
        except Exception as exc:
            raise ModelError(f"{Path(model_path).name}: onnx.reference cannot load the model: "
                             f"{short_message(exc)}") from None
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
        check_feeds(self.target, self.input_names, feeds)
        outputs = run_evaluator(self._evaluator, dict(feeds))
        return {name: np.asarray(value) for name, value in zip(self.output_names, outputs, strict=True)}
