"""Bound calls: a model call with its inputs bound once, what a benchmark times (``Session.bind``).

The default ``BoundCall`` goes through ``Session.run``; ``OrtBoundCall`` uses ONNX Runtime's IOBinding.
OpenVINO's lives beside its adapter (qdeploy/targets/openvino.py).
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from qdeploy.core.compare import as_arrays

__all__ = ["BoundCall", "OrtBoundCall"]


class _Runs(Protocol):
    """What a bound call needs of a session (``qdeploy.targets.base.Session``, which builds bound calls)."""

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]: ...


class BoundCall:
    """A model call with its inputs bound once: ``run()`` is what a benchmark times, ``outputs()`` reads back.

    This default converts the feeds and copies the outputs on every call (``Session.run``); runtimes that can
    bind inputs once (ONNX Runtime's IOBinding, OpenVINO's InferRequest tensors) override it.  Outputs are
    never pre-allocated from the model's declared shapes: the runtime allocates them at their real shape.
    """

    description = "Session.run(feeds): feeds converted and outputs copied on every call"

    def __init__(self, session: _Runs, feeds: dict[str, np.ndarray]) -> None:
        self._session = session
        self._feeds = feeds
        self._last: dict[str, np.ndarray] = {}

    def run(self) -> None:
        self._last = self._session.run(self._feeds)

    def outputs(self) -> dict[str, np.ndarray]:
        """Outputs of the last ``run()`` by ONNX output name (a name the graph lists twice appears once)."""
        return self._last


class OrtBoundCall(BoundCall):
    """``InferenceSession.run_with_iobinding`` on inputs bound once; outputs bound by name, allocated by ORT.

    An output stays bound to the buffer ORT allocated at its first run, and ORT checks a bound buffer against
    the declared shape: a model whose declaration is wrong (a static batch of 1 on the output of a
    dynamic-batch model) would fail its second run ("Got invalid dimensions for output").  So after the first
    run the real shapes are compared with the declared ones; where they conflict, outputs are bound again by
    name before every run (ORT then allocates them at their real shape, as ``run`` does), which costs a few
    microseconds (benchmarks/ort_bound_call.py).
    """

    description = "InferenceSession.run_with_iobinding() on inputs bound once, outputs to host memory"
    REBOUND = ("InferenceSession.run_with_iobinding() on inputs bound once, outputs bound again each run "
               "(their declared shape is wrong)")

    def __init__(self, session: Any, feeds: dict[str, np.ndarray], output_names: list[str],
                 rebind_outputs: bool | None = None) -> None:
        """`rebind_outputs`: None decides after the first run, from the declared and the real output shapes."""
        self._ort = session
        self._names = list(dict.fromkeys(output_names))  # a graph may list one output twice; bind it once
        self._declared = {value.name: value.shape for value in session.get_outputs()}
        self._binding = session.io_binding()
        for name, value in feeds.items():
            self._binding.bind_cpu_input(name, np.ascontiguousarray(value))
        self._bind_outputs()
        self._first = rebind_outputs is None
        self._rebind = bool(rebind_outputs)

    def _bind_outputs(self) -> None:
        self._binding.clear_binding_outputs()
        for name in self._names:
            self._binding.bind_output(name, "cpu")  # no shape, no buffer: never pre-allocated from a declaration

    def run(self) -> None:
        if self._rebind:
            self._bind_outputs()
        self._ort.run_with_iobinding(self._binding)
        if self._first:
            self._first = False
            self._rebind = self._declarations_conflict()
            if self._rebind:
                self.description = self.REBOUND

    def _declarations_conflict(self) -> bool:
        for name, value in zip(self._names, self._binding.get_outputs(), strict=True):
            if not value.is_tensor():  # a sequence or map (scikit-learn's ZipMap) has no shape to conflict
                continue
            declared, actual = self._declared.get(name), value.shape()
            if declared is not None and (len(declared) != len(actual) or any(
                    isinstance(d, int) and d > 0 and d != a for d, a in zip(declared, actual, strict=True))):
                return True
        return False

    def outputs(self) -> dict[str, np.ndarray]:
        return as_arrays(self._names, self._binding.copy_outputs_to_cpu())
