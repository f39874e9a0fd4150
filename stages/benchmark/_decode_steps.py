"""One generation step at a time on a loaded session: bind a call's inputs (untimed), make the call (what is timed),
read the logits and the cache back (untimed).

The presents of a call become the past of the next by reference, never copied by qdeploy:
- ONNX Runtime: ``InferenceSession.run_with_ort_values``; the presents stay ORT tensors (OrtValue) and are fed back
  as they are (``Session.run`` would convert every present to a new numpy array inside the timed call);
- OpenVINO: two InferRequests of the one compiled model (the one the latency rows timed; dynamic shapes kept, never
  reshaped to static), taking turns: each step's request reads the other's output tensors as its past, so no
  request ever writes the tensor it reads;
- any other session: ``Session.run`` with the returned arrays fed back.
``checked_stepper`` runs a prefill and one step both ways and keeps the fast path only when its logits match
``Session.run``'s, as ``bind_inputs`` does for the latency call.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import numpy as np

from qdeploy.targets import OrtSession
from qdeploy.targets.openvino import OpenVinoSession

if TYPE_CHECKING:
    from qdeploy.stages.benchmark._cache_layout import CacheLayout
    from qdeploy.targets import Session

__all__ = ["OpenVinoStepper", "OrtStepper", "PlainStepper", "Stepper", "checked_stepper", "next_ids"]

log = logging.getLogger(__name__)


class Stepper:
    """Drives one generation on a session; ``call`` is the only timed method."""

    description = ""

    def __init__(self, layout: CacheLayout) -> None:
        self.layout = layout

    def bind_prefill(self, feeds: dict[str, np.ndarray]) -> None:
        """Bind a first call's inputs (its past empty)."""
        raise NotImplementedError

    def bind_step(self, feeds: dict[str, np.ndarray]) -> None:
        """Bind the next call: the given token ids, mask and positions; as past the presents of the last call."""
        raise NotImplementedError

    def call(self) -> None:
        raise NotImplementedError

    def logits(self) -> np.ndarray:
        raise NotImplementedError

    def cache_length(self) -> int:
        """Length of the cache the last call returned (its first present along the past axis)."""
        raise NotImplementedError


class PlainStepper(Stepper):
    description = "Session.run(feeds); the presents it returns fed back as past (no copy by qdeploy)"

    def __init__(self, session: Session, layout: CacheLayout) -> None:
        super().__init__(layout)
        self._session = session
        self._feeds: dict[str, np.ndarray] = {}
        self._out: dict[str, np.ndarray] = {}

    def bind_prefill(self, feeds: dict[str, np.ndarray]) -> None:
        self._feeds = feeds

    def bind_step(self, feeds: dict[str, np.ndarray]) -> None:
        self._feeds = {**feeds, **{pair.past: self._out[pair.present] for pair in self.layout.pairs}}

    def call(self) -> None:
        self._out = self._session.run(self._feeds)

    def logits(self) -> np.ndarray:
        return self._out[self.layout.logits]

    def cache_length(self) -> int:
        first = self.layout.pairs[0]
        return int(self._out[first.present].shape[first.axis])


class OrtStepper(Stepper):
    description = ("InferenceSession.run_with_ort_values(); the presents stay ORT tensors and are fed back as past "
                   "by reference")

    def __init__(self, session: Any, layout: CacheLayout) -> None:
        super().__init__(layout)
        self._ort = session
        self._names = [layout.logits, *(pair.present for pair in layout.pairs)]
        self._inputs: dict[str, Any] = {}
        self._out: list[Any] = []

    def _values(self, feeds: dict[str, np.ndarray]) -> dict[str, Any]:
        from onnxruntime import OrtValue

        return {name: OrtValue.ortvalue_from_numpy(np.ascontiguousarray(value)) for name, value in feeds.items()}

    def bind_prefill(self, feeds: dict[str, np.ndarray]) -> None:
        self._inputs = self._values(feeds)

    def bind_step(self, feeds: dict[str, np.ndarray]) -> None:
        self._inputs = {**self._values(feeds),
                        **{pair.past: self._out[1 + index] for index, pair in enumerate(self.layout.pairs)}}

    def call(self) -> None:
        self._out = self._ort.run_with_ort_values(self._names, self._inputs)

    def logits(self) -> np.ndarray:
        return self._out[0].numpy()

    def cache_length(self) -> int:
        return int(self._out[1].shape()[self.layout.pairs[0].axis])


class OpenVinoStepper(Stepper):
    description = ("InferRequest.infer() of the compiled model the latency rows timed, two requests taking turns: "
                   "each reads the other's present tensors as its past, by reference")

    def __init__(self, compiled: Any, layout: CacheLayout) -> None:
        super().__init__(layout)
        self._requests = [compiled.create_infer_request(), compiled.create_infer_request()]
        self._in = _ports(compiled.inputs)
        self._out = _ports(compiled.outputs)
        self._kept: list[list[np.ndarray]] = [[], []]  # arrays behind the input tensors, alive while bound
        self._turn = 0

    def _set(self, turn: int, feeds: dict[str, np.ndarray]) -> None:
        import openvino

        request = self._requests[turn]
        self._kept[turn] = []
        for name, value in feeds.items():
            array = np.ascontiguousarray(value)
            self._kept[turn].append(array)
            request.set_input_tensor(self._in[name], openvino.Tensor(array))

    def bind_prefill(self, feeds: dict[str, np.ndarray]) -> None:
        self._turn = 0
        self._set(0, feeds)

    def bind_step(self, feeds: dict[str, np.ndarray]) -> None:
        last, turn = self._requests[self._turn], 1 - self._turn
        self._set(turn, feeds)
        for pair in self.layout.pairs:
            self._requests[turn].set_input_tensor(self._in[pair.past], last.get_output_tensor(self._out[pair.present]))
        self._turn = turn

    def call(self) -> None:
        self._requests[self._turn].infer()

    def logits(self) -> np.ndarray:
        return np.asarray(self._requests[self._turn].get_output_tensor(self._out[self.layout.logits]).data)

    def cache_length(self) -> int:
        first = self.layout.pairs[0]
        return int(self._requests[self._turn].get_output_tensor(self._out[first.present]).shape[first.axis])


def _ports(ports: Any) -> dict[str, int]:
    """Tensor name -> port index (a port may carry several names)."""
    found: dict[str, int] = {}
    for index, port in enumerate(ports):
        for name in port.get_names():
            found.setdefault(name, index)
    return found


def next_ids(logits: np.ndarray) -> np.ndarray:
    """Greedy next token of each sequence, [batch, 1]."""
    return np.argmax(logits[:, -1, :], axis=-1).reshape(-1, 1).astype(np.int64)


def _fast_stepper(session: Session, layout: CacheLayout) -> Stepper | None:
    if isinstance(session, OpenVinoSession):
        return OpenVinoStepper(session.compiled_model, layout)
    if isinstance(session, OrtSession):
        # the adapter wraps no OrtValue call; its InferenceSession runs one without converting the presents
        return OrtStepper(session.inference_session, layout)
    return None


def _first_step(stepper: Stepper, prefill: dict[str, np.ndarray], prompt: int) -> np.ndarray:
    stepper.bind_prefill(prefill)
    stepper.call()
    stepper.bind_step(stepper.layout.step_inputs(next_ids(stepper.logits()), prompt))
    stepper.call()
    return np.array(stepper.logits(), dtype=np.float64)


def checked_stepper(session: Session, layout: CacheLayout, prefill: dict[str, np.ndarray],
                    prompt: int) -> tuple[Stepper, list[str]]:
    """The stepper to time, and notes: the runtime's by-reference path when its first decode step gives
    ``Session.run``'s logits, else ``Session.run`` itself."""
    plain = PlainStepper(session, layout)
    fast = _fast_stepper(session, layout)
    if fast is None:
        return plain, []
    try:
        got = _first_step(fast, prefill, prompt)
    except Exception as exc:  # the fast path is an optimisation of the measurement, never a failure of it
        log.debug("decode steps by reference failed on %s", session.target, exc_info=True)
        return plain, [f"decode: {type(fast).__name__} failed ({type(exc).__name__}: {exc}); timed Session.run"]
    expected = _first_step(plain, prefill, prompt)
    if got.shape == expected.shape and np.allclose(got, expected, rtol=1e-4, atol=1e-5, equal_nan=True):
        return fast, []
    log.warning("target %s: decode steps by reference differ from Session.run; timing Session.run", session.target)
    return plain, ["decode: the by-reference steps gave other logits than Session.run; timed Session.run"]
