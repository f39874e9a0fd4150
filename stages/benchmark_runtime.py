"""What the benchmark stage needs of a loaded session beyond ``Session.run``: the call to time with its
inputs bound once, the threads/streams/hints the runtime really uses, and the memory the session takes.

The target adapters (pipeline/targets.py) expose ``Session.run(feeds)``, which converts and copies the
feeds and the outputs on every call.  For timing, inputs are bound once outside the timed region, as
OpenVINO's benchmark_app and ONNX Runtime's perf test do: OpenVINO ``InferRequest.infer()`` on input
tensors set once, ONNX Runtime ``run_with_iobinding`` on inputs bound once (outputs still come back to
host memory each run).  Both are reached through the sessions' runtime objects (``_request``,
``_session``); a session without them is timed through ``Session.run``.  The bound call is checked
against ``Session.run`` once before it is trusted.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from pipeline.targets import Session

log = logging.getLogger(__name__)

TIMED_CALLS = {
    "openvino": "InferRequest.infer() on input tensors set once",
    "onnxruntime": "InferenceSession.run_with_iobinding() on inputs bound once, outputs to host memory",
    "session": "Session.run(feeds): feeds converted and outputs copied on every call",
}


def bind_inputs(session: Session, feeds: dict[str, np.ndarray],
                expected: dict[str, np.ndarray]) -> tuple[Callable[[], Any], str]:
    """The call to time, with `feeds` bound once, and which call it is.

    `expected` are the outputs of ``session.run(feeds)``; a bound call whose outputs differ is not used.
    """
    try:
        bound = _bind_openvino(session, feeds) or _bind_onnxruntime(session, feeds)
    except Exception as exc:  # binding is an optimisation of the measurement, never a failure of it
        log.debug("binding inputs of %s failed: %s", session.target, exc, exc_info=True)
        bound = None
    if bound is not None:
        call, read_outputs, kind = bound
        call()
        if _same_outputs(read_outputs(), expected, session.output_names):
            return call, TIMED_CALLS[kind]
        log.warning("target %s: outputs of the bound call differ from Session.run; timing Session.run",
                    session.target)
    return partial(session.run, feeds), TIMED_CALLS["session"]


def _bind_openvino(session: Session, feeds: dict[str, np.ndarray]) -> tuple[Callable[[], Any], Any, str] | None:
    request = getattr(session, "_request", None)
    ports = getattr(session, "_output_ports", None)
    inputs = getattr(session, "_input_ports", None)
    if request is None or ports is None or inputs is None:
        return None
    import openvino

    for name, index in inputs.items():
        request.set_input_tensor(index, openvino.Tensor(np.ascontiguousarray(feeds[name])))

    def read_outputs() -> dict[str, np.ndarray]:
        return {name: np.array(request.get_output_tensor(index).data) for name, index in ports.items()}

    return request.infer, read_outputs, "openvino"


def _bind_onnxruntime(session: Session, feeds: dict[str, np.ndarray]) -> tuple[Callable[[], Any], Any, str] | None:
    ort_session = getattr(session, "_session", None)
    if ort_session is None or not hasattr(ort_session, "io_binding"):
        return None
    binding = ort_session.io_binding()
    for name in session.input_names:
        binding.bind_cpu_input(name, np.ascontiguousarray(feeds[name]))
    for name in session.output_names:
        binding.bind_output(name, "cpu")

    def read_outputs() -> dict[str, np.ndarray]:
        return dict(zip(session.output_names, binding.copy_outputs_to_cpu(), strict=True))

    return partial(ort_session.run_with_iobinding, binding), read_outputs, "onnxruntime"


def _same_outputs(got: dict[str, np.ndarray], expected: dict[str, np.ndarray], names: list[str]) -> bool:
    for name in names:
        a, b = np.asarray(got.get(name)), np.asarray(expected.get(name))
        if a.shape != b.shape:
            return False
        if np.issubdtype(b.dtype, np.floating):
            if not np.allclose(a.astype(np.float64), b.astype(np.float64), rtol=1e-4, atol=1e-5, equal_nan=True):
                return False
        elif not np.array_equal(a, b):
            return False
    return True


def runtime_settings(session: Session) -> dict[str, Any]:
    """Threads, streams and hints the runtime really uses, read back from the loaded session."""
    compiled = getattr(session, "_compiled", None)  # OpenVINO CompiledModel
    if compiled is not None:
        settings: dict[str, Any] = {}
        for key in ("PERFORMANCE_HINT", "NUM_STREAMS", "INFERENCE_NUM_THREADS", "INFERENCE_PRECISION_HINT",
                    "OPTIMAL_NUMBER_OF_INFER_REQUESTS", "ENABLE_CPU_PINNING"):
            try:
                settings[key] = _plain(compiled.get_property(key))
            except Exception:  # not every device has every property
                continue
        return settings
    ort_session = getattr(session, "_session", None)  # onnxruntime InferenceSession
    if ort_session is not None and hasattr(ort_session, "get_session_options"):
        options = ort_session.get_session_options()
        intra = options.intra_op_num_threads
        return {"intra_op_num_threads": intra or "default (one per physical core)",
                "inter_op_num_threads": options.inter_op_num_threads or "default",
                "execution_mode": str(options.execution_mode).rsplit(".", 1)[-1].lower().removeprefix("ort_"),
                "graph_optimization_level": str(options.graph_optimization_level).rsplit(".", 1)[-1]}
    return {}


def _plain(value: Any) -> Any:
    """An OpenVINO property value as JSON: numbers and booleans as they are, enums and types by name."""
    if isinstance(value, bool | int | float | str):
        return value
    if hasattr(value, "get_type_name"):
        return value.get_type_name()
    return str(value).rsplit(".", 1)[-1]



class MemoryProbe:
    """Peak resident memory the process gains from now until `finish` (Linux; None elsewhere).

    It resets the kernel's peak-RSS mark (write 5 to /proc/self/clear_refs), notes VmRSS, and at the end
    reads VmHWM: the growth covers session creation, the first run and warm-up (weights, compiled kernels,
    the runtime's arenas).  Memory the process freed earlier and the runtime reuses is not seen again, so
    this is a lower bound of the session's footprint.
    """

    METHOD = "peak RSS growth (VmHWM after - VmRSS before) over session creation, first run and warm-up"

    def __init__(self) -> None:
        self._reset = _reset_peak_rss()
        self._before_kb = _proc_status_kb("VmRSS")

    def finish(self) -> dict[str, Any] | None:
        after_kb, peak_kb = _proc_status_kb("VmRSS"), _proc_status_kb("VmHWM")
        if self._before_kb is None or after_kb is None:
            return None
        method = self.METHOD if self._reset and peak_kb is not None else \
            "RSS growth (VmRSS after - VmRSS before); the peak mark could not be reset"
        peak = peak_kb if self._reset and peak_kb is not None else after_kb
        return {"peak_growth_mb": max(0, peak - self._before_kb) / 1024, "rss_before_mb": self._before_kb / 1024,
                "rss_after_mb": after_kb / 1024, "method": method}


def _proc_status_kb(field: str) -> int | None:
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as handle:
            for line in handle:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def _reset_peak_rss() -> bool:
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as handle:
            handle.write("5")
        return True
    except OSError:
        return False
