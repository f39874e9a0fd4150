"""Request pools: a model served with many requests in flight, each runtime its own way (throughput mode).

- OpenVINO: compiled with PERFORMANCE_HINT THROUGHPUT; the pool is an ``AsyncInferQueue`` of
  OPTIMAL_NUMBER_OF_INFER_REQUESTS requests (the number the plugin suggests for its streams), each request's
  input tensors set once.  ``run_for`` is benchmark_app's inference-only async loop: start the next idle request
  until the time is spent and the count is a multiple of the queue's size, then wait for all; each request's
  latency is its own ``latency``.
- ONNX Runtime: one session with one intra-op thread per request and ``requests`` caller threads (the
  physical cores by default), each looping ``run_with_iobinding`` on its own binding.  A concurrent ``Run`` on
  one session is thread-safe and holds the weights once; it matched one session per caller within noise, while
  two intra-op threads per caller on 2 cores lost 30-40% (research for issue 18, docs/verdict-and-throughput.md).

Timing belongs to the caller: a pool only runs.  ``run_for`` returns (inferences, elapsed seconds, latencies ms).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from qdeploy.core.errors import ModelError, TargetUnavailable
from qdeploy.targets import OrtBoundCall, OrtTarget, check_feeds, get_target, short_message
from qdeploy.targets.openvino import OpenVinoTarget, _match_ports, _ov_core, _plain, onnx_io_names
from qdeploy.targets.openvino_read import read_onnx

__all__ = ["OpenVinoPool", "OrtPool", "RequestPool", "open_pool", "physical_cores"]

log = logging.getLogger(__name__)


class RequestPool:
    """A model with ``requests`` requests kept in flight."""

    requests: int
    streams: int
    threads_per_request: int
    call: str
    """What one request runs, in words (the report's ``call``)."""

    def run_for(self, seconds: float) -> tuple[int, float, list[float]]:
        raise NotImplementedError

    def settings(self) -> dict[str, Any]:
        return {}

    def close(self) -> None:
        """Release the compiled model or session."""


def physical_cores() -> int:
    """Cores this process may use, counting SMT siblings once where Linux says which they are."""
    allowed = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    cores = set()
    for cpu in allowed:
        try:
            siblings = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list").read_text().strip()
        except OSError:
            siblings = str(cpu)
        cores.add(siblings)
    return max(1, len(cores))


def open_pool(target: str, model_path: Path, feeds: dict[str, np.ndarray], requests: int | None,
              pin_f32: bool = True, precision: str | None = None) -> RequestPool:
    """A pool of `requests` requests (None: the runtime's own suggestion) with `feeds` bound once; ``precision``
    (OpenVINO only) pins INFERENCE_PRECISION_HINT as ``OpenVinoTarget.load`` does."""
    adapter = get_target(target)
    ok, reason = adapter.availability()
    if not ok:
        raise TargetUnavailable(reason)
    if not adapter.benchmarkable:
        raise TargetUnavailable(f"target {target} is for fidelity checks only")
    if isinstance(adapter, OrtTarget):
        return OrtPool(adapter, model_path, feeds, requests or physical_cores(), pin_f32)

    assert isinstance(adapter, OpenVinoTarget)
    return OpenVinoPool(adapter, model_path, feeds, requests, pin_f32, precision)


class OpenVinoPool(RequestPool):
    """PERFORMANCE_HINT THROUGHPUT and an AsyncInferQueue, as benchmark_app -hint throughput runs."""

    call = "AsyncInferQueue.start_async() on input tensors set once per request (benchmark_app's async loop)"

    def __init__(self, adapter: Any, model_path: Path, feeds: dict[str, np.ndarray], requests: int | None,
                 pin_f32: bool, precision: str | None = None) -> None:
        import openvino


        input_names, _ = onnx_io_names(model_path)
        check_feeds(adapter.name, input_names, feeds)
        config, self._notes = adapter._compile_config(None, pin_f32, precision)
        config["PERFORMANCE_HINT"] = "THROUGHPUT"
        try:
            model, read_notes = read_onnx(_ov_core(), model_path)
        except Exception as exc:
            raise ModelError(f"{model_path.name}: OpenVINO cannot read the model: {short_message(exc)}") from None
        self._notes = [*read_notes, *self._notes]
        try:
            self._compiled = _ov_core().compile_model(model, adapter.ov_device, config)
        except Exception as exc:
            adapter.refuse_missing_float16(model, model_path, exc)  # the device's fact, as in adapter.load
            raise ModelError(f"{model_path.name}: OpenVINO cannot compile the model for {adapter.ov_device} "
                             f"with PERFORMANCE_HINT THROUGHPUT: {short_message(exc)}") from None
        self._plain = _plain
        suggested = int(self._compiled.get_property("OPTIMAL_NUMBER_OF_INFER_REQUESTS"))
        self.requests = requests or suggested
        self.streams = int(self._read("NUM_STREAMS") or 1)
        threads = int(self._read("INFERENCE_NUM_THREADS") or 0)
        self.threads_per_request = max(1, threads // max(1, self.streams)) if threads else 1
        self._queue = openvino.AsyncInferQueue(self._compiled, self.requests)
        ports = _match_ports(self._compiled.inputs, input_names, "input")
        self._inputs = {name: np.ascontiguousarray(feeds[name]) for name in input_names}  # tensors share them
        for index in range(len(self._queue)):
            for name, port in ports.items():
                self._queue[index].set_input_tensor(port, openvino.Tensor(self._inputs[name]))

    def _read(self, key: str) -> Any:
        try:
            return self._plain(self._compiled.get_property(key))
        except Exception:  # not every device has every property
            return None

    def run_for(self, seconds: float) -> tuple[int, float, list[float]]:
        queue, size = self._queue, len(self._queue)
        latencies: list[float] = []
        started: set[int] = set()
        count = 0
        start = time.perf_counter()
        while time.perf_counter() - start < seconds or count % size:
            idle = queue.get_idle_request_id()
            if idle in started:
                latencies.append(queue[idle].latency)
            started.add(idle)
            queue.start_async()
            count += 1
        queue.wait_all()
        elapsed = time.perf_counter() - start
        latencies += [queue[index].latency for index in started]
        return count, elapsed, latencies

    def settings(self) -> dict[str, Any]:
        keys = ("PERFORMANCE_HINT", "NUM_STREAMS", "INFERENCE_NUM_THREADS", "OPTIMAL_NUMBER_OF_INFER_REQUESTS",
                "INFERENCE_PRECISION_HINT", "ENABLE_CPU_PINNING")
        found = {key: self._read(key) for key in keys}
        return {key: value for key, value in found.items() if value is not None}

    def close(self) -> None:
        self._queue = None  # type: ignore[assignment]
        self._compiled = None


class OrtPool(RequestPool):
    """One InferenceSession with one intra-op thread per request; `requests` callers run it concurrently."""

    call = "InferenceSession.run_with_iobinding() from N caller threads over one shared session, inputs bound once"

    def __init__(self, adapter: OrtTarget, model_path: Path, feeds: dict[str, np.ndarray], requests: int,
                 pin_f32: bool) -> None:
        self._session = adapter.load(model_path, threads=1, pin_f32=pin_f32)
        try:
            self._session.run(feeds)  # reads which kernels ran, and checks the feeds fit
            ort_session = self._session._session  # type: ignore[attr-defined]
            self._calls = [OrtBoundCall(ort_session, feeds, self._session.output_names) for _ in range(requests)]
            for call in self._calls:
                call.run()
        except BaseException:
            self._session.close()
            raise
        self.requests = self.streams = requests
        self.threads_per_request = 1

    def run_for(self, seconds: float) -> tuple[int, float, list[float]]:
        """All callers start together and stop at the deadline; a call running then is finished and counted."""
        per_caller: list[list[float]] = [[] for _ in self._calls]
        errors: list[BaseException] = []
        barrier = threading.Barrier(len(self._calls) + 1)
        deadline = [0.0]

        def caller(index: int) -> None:
            call, latencies = self._calls[index], per_caller[index]
            barrier.wait()
            try:
                while True:
                    begin = time.perf_counter()
                    call.run()
                    end = time.perf_counter()
                    latencies.append((end - begin) * 1e3)
                    if end >= deadline[0]:
                        return
            except BaseException as exc:  # re-raised in the timing thread below
                errors.append(exc)

        threads = [threading.Thread(target=caller, args=(index,), daemon=True) for index in range(len(self._calls))]
        for thread in threads:
            thread.start()
        start = time.perf_counter()
        deadline[0] = start + seconds
        barrier.wait()
        for thread in threads:
            thread.join()
        elapsed = time.perf_counter() - start
        if errors:
            raise errors[0]
        latencies = [value for values in per_caller for value in values]
        return len(latencies), elapsed, latencies

    def settings(self) -> dict[str, Any]:
        return {**self._session.runtime_settings(), "callers": self.requests, "sessions": 1}

    def close(self) -> None:
        self._session.close()
