"""What the benchmark stage needs of a loaded session beyond ``Session.run``: the call to time with its
inputs bound once, and the memory the session takes.

The target adapters (qdeploy/targets/) expose ``Session.run(feeds)``, which converts and copies the
feeds and the outputs on every call, and ``Session.bind(feeds)``, which binds the inputs once as OpenVINO's
benchmark_app and ONNX Runtime's perf test do: OpenVINO ``InferRequest.infer()`` on input tensors set once,
ONNX Runtime ``run_with_iobinding`` on inputs bound once (outputs come back to host memory each run,
allocated by the runtime at their real shape, never from the declared one; see ``OrtBoundCall``).  The
bound call is checked against ``Session.run`` once before it is trusted.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypedDict

import numpy as np

from qdeploy.targets import BoundCall, OrtBoundCall
from qdeploy.targets.openvino import OpenVinoBoundCall

if TYPE_CHECKING:
    from qdeploy.targets import Session

log = logging.getLogger(__name__)

TIMED_CALLS = {
    "openvino": OpenVinoBoundCall.description,
    "onnxruntime": OrtBoundCall.description,
    "onnxruntime-rebound": OrtBoundCall.REBOUND,
    "session": BoundCall.description,
}


def bind_inputs(session: Session, feeds: dict[str, np.ndarray],
                expected: dict[str, np.ndarray]) -> tuple[Callable[[], Any], str]:
    """The call to time, with `feeds` bound once, and which call it is.

    `expected` are the outputs of ``session.run(feeds)``; a bound call whose outputs differ is not used.
    """
    bound: BoundCall | None
    try:
        bound = session.bind(feeds)
        bound.run()
    except Exception as exc:  # binding is an optimisation of the measurement, never a failure of it
        log.debug("binding inputs of %s failed: %s", session.target, exc, exc_info=True)
        bound = None
    if bound is not None:
        if _same_outputs(bound.outputs(), expected):
            return bound.run, bound.description
        log.warning("target %s: outputs of the bound call differ from Session.run; timing Session.run",
                    session.target)
    plain = BoundCall(session, feeds)
    return plain.run, plain.description


def _same_outputs(got: dict[str, np.ndarray], expected: dict[str, np.ndarray]) -> bool:
    if set(got) != set(expected):
        return False
    for name, value in expected.items():
        a, b = np.asarray(got[name]), np.asarray(value)
        if a.shape != b.shape:
            return False
        if np.issubdtype(b.dtype, np.floating):
            if not np.allclose(a.astype(np.float64), b.astype(np.float64), rtol=1e-4, atol=1e-5, equal_nan=True):
                return False
        elif not np.array_equal(a, b):
            return False
    return True


class MemoryGrowth(TypedDict):
    """A row's ``memory``: what loading, the first run and warm-up added to the process (``MemoryProbe``)."""

    peak_growth_mb: float
    rss_before_mb: float
    rss_after_mb: float
    method: str


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

    def finish(self) -> MemoryGrowth | None:
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
