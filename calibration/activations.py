"""Activation statistics: run a float model on calibration data and gather per-tensor statistics.

The model is run in ONNX Runtime with the wanted tensors added as outputs, one
sample at a time, so memory holds one sample's activations at most.  A first
pass records each tensor's minimum, maximum and |max|; when a histogram method
is asked for, a second pass over the same data fills a histogram spanning the
range of the first pass (exact bins, no re-binning as the range grows).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Iterable, Iterator
from pathlib import Path

import numpy as np

from qdeploy.calibration.batches import Feed
from qdeploy.calibration.ranges import DEFAULT_BINS, TensorStats
from qdeploy.core.onnx_wire import load_model
from qdeploy.graph.external_data import copy_exposing, remove_saved

__all__ = ["FeedSource", "channel_absmax", "collect_statistics", "float_tensors_of"]

log = logging.getLogger(__name__)

FeedSource = Callable[[], Iterator[Feed]]
"""Returns a fresh iterator over the calibration feeds each time it is called (one call per pass)."""

_FLOAT_ELEM_TYPES = (1, 10)  # float, float16
PROBE = "calibration_probe.onnx"


def float_tensors_of(model_path: Path, op_types: Iterable[str] | None = None) -> list[str]:
    """Float tensors (not initializers) that are inputs or outputs of the main graph's nodes of op_types."""

    model = load_model(model_path, load_external_data=False)
    graph = model.graph
    types = {value.name: value.type.tensor_type.elem_type
             for value in (*graph.value_info, *graph.input, *graph.output) if value.type.HasField("tensor_type")}
    initializers = {init.name for init in graph.initializer}
    wanted = set(op_types) if op_types is not None else None
    names: dict[str, None] = {}
    for node in graph.node:
        if wanted is not None and node.op_type not in wanted:
            continue
        for name in (*node.input, *node.output):
            if name and name not in initializers and types.get(name) in _FLOAT_ELEM_TYPES:
                names[name] = None
    return list(names)


def collect_statistics(model_path: Path, tensors: list[str], feeds: FeedSource, work_dir: Path, *,
                       histogram: bool = False, bins: int = DEFAULT_BINS,
                       per_channel: Collection[str] = ()) -> tuple[dict[str, TensorStats], int]:
    """Statistics of each named tensor over the feeds; returns them and how many samples were used.  The tensors
    in ``per_channel`` also get their largest |value| per channel (axis 1, NCHW's)."""
    session, outputs = _probe_session(model_path, tensors, work_dir)
    exposed = set(outputs)
    from_feed = [name for name in tensors if name not in exposed]
    stats = {name: TensorStats() for name in tensors}
    samples = 0
    for feed in feeds():
        for name, value in _run(session, outputs, from_feed, feed):
            stats[name].update_range(value)
            if name in per_channel:
                stats[name].update_channel_peak(value)
        samples += 1
    if histogram:
        for feed in feeds():
            for name, value in _run(session, outputs, from_feed, feed):
                stats[name].update_histogram(value, bins)
    log.debug("activation statistics of %d tensors over %d samples", len(tensors), samples)
    del session
    remove_saved(work_dir / PROBE)  # its data file is a copy of the weights on disk
    return stats, samples


def channel_absmax(model_path: Path, tensors: list[str], feeds: FeedSource,
                   work_dir: Path) -> tuple[dict[str, np.ndarray], int]:
    """Per channel (the last axis) largest |value| of each named tensor over the feeds, and the samples used:
    what activation smoothing (SmoothQuant) divides by."""
    session, outputs = _probe_session(model_path, tensors, work_dir)
    found: dict[str, np.ndarray] = {}
    samples = 0
    for feed in feeds():
        values = session.run(outputs, feed) if outputs else []  # type: ignore[attr-defined]
        pairs = [*zip(outputs, values, strict=True), *((name, feed[name]) for name in tensors if name in feed)]
        for name, value in pairs:
            array = np.abs(np.asarray(value, dtype=np.float32))
            if array.ndim == 0 or not array.size:
                continue
            peak = array.reshape(-1, array.shape[-1]).max(axis=0)
            found[name] = peak if name not in found else np.maximum(found[name], peak)
        samples += 1
    del session
    remove_saved(work_dir / PROBE)  # its data file is a copy of the weights on disk
    return found, samples


def _probe_session(model_path: Path, tensors: list[str], work_dir: Path) -> tuple[object, list[str]]:
    """An ORT session of the model with every wanted tensor exposed as an output."""
    import onnx
    import onnxruntime as ort

    inputs = {value.name for value in load_model(model_path, load_external_data=False).graph.input}
    probe = work_dir / PROBE
    # weights copied file to file: never in memory here while ONNX Runtime loads them
    copy_exposing(model_path, probe, [onnx.ValueInfoProto(name=name) for name in tensors if name not in inputs])
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    options.log_severity_level = 3
    session = ort.InferenceSession(str(probe), options, providers=["CPUExecutionProvider"])
    wanted = set(tensors)
    return session, [out.name for out in session.get_outputs() if out.name in wanted]


def _run(session: object, outputs: list[str], from_feed: list[str],
         feed: Feed) -> Iterator[tuple[str, np.ndarray]]:
    """(name, float32 values) of every wanted tensor: run outputs, and graph inputs from the feed."""
    values = session.run(outputs, feed) if outputs else []  # type: ignore[attr-defined]
    pairs = [*zip(outputs, values, strict=True), *((name, feed[name]) for name in from_feed if name in feed)]
    for name, value in pairs:
        array = np.asarray(value)
        if array.size and np.issubdtype(array.dtype, np.floating):
            yield name, array.astype(np.float32, copy=False)
