"""Fidelity of an fp16 artifact under float16 arithmetic, not under a CPU provider's float32 fallbacks.

- ``run_emulated``: the artifact's emulation twin (qdeploy.stages.fp16._emulate) on ORT with
  every intermediate exposed: graph outputs per sample and the tensors that hold
  Inf/NaN where float32 held none;
- ``overflow_births``: where those values are born (a node whose inputs are finite and
  whose output is not, or the Cast into float16 that overflowed), as nodes to keep in float32;
- ``reference_check``: onnx's reference evaluator, every op in its declared precision.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NotRequired, TypedDict

from qdeploy.core.compare import as_arrays, compare_outputs
from qdeploy.core.output_store import OutputStore
from qdeploy.graph.external_data import STREAM_ABOVE_BYTES, save_exposing
from qdeploy.graph.utils import model_bytes
from qdeploy.stages.fp16._activations import probe_session
from qdeploy.stages.fp16._emulate import NONFINITE_SUFFIX, emulation_twin
from qdeploy.targets.evaluator import EvaluatorCannotRun, build_evaluator, run_evaluator

if TYPE_CHECKING:
    import numpy as np
    import onnx

    from qdeploy.core.compare import OutputComparison
    from qdeploy.core.tolerance import Tolerance
    from qdeploy.stages.fp16._activations import ActivationPeaks
    from qdeploy.stages.fp16._headroom import HeadroomRecord
    from qdeploy.stages.fp16.findings import KeptNode

log = logging.getLogger(__name__)

Feeds = list[dict[str, "np.ndarray"]]
EMULATED = "onnxruntime float32 kernels, every float16 tensor of the artifact rounded to float16"
REFERENCE = "onnx.reference.ReferenceEvaluator, every op in its declared precision"
REFERENCE_SAMPLES = 4
"""The reference evaluator is slow (seconds per sample on a mid-size CNN): it sees at most this many."""


class FidelityCheck(TypedDict):
    """A comparison with the float32 outputs in findings form (``fidelity.emulated``, ``fidelity.reference``)."""

    method: str
    samples: int
    passed: bool
    reasons: list[str]
    worst: dict[str, float | None]
    seconds: float
    headroom: NotRequired[HeadroomRecord]
    """The emulated check's only: the stricter target it aimed at (``_headroom``)."""


class ReferenceUnavailable(TypedDict):
    """The reference check when onnx's evaluator cannot run an op of the artifact."""

    method: str
    status: str
    passed: None
    reason: str
    op_type: str
    seconds: float


class Fp16Fidelity(TypedDict, total=False):
    """The findings' ``fidelity``: the emulated check, and the reference evaluator's when asked for."""

    emulated: FidelityCheck
    reference: FidelityCheck | ReferenceUnavailable


@dataclass
class EmulatedRun:
    """Graph outputs per sample, and the tensors that went non-finite under float16 emulation."""

    outputs: list[Mapping[str, np.ndarray]]
    nonfinite: set[str]


def run_emulated(model: onnx.ModelProto, feeds: Feeds, stats: dict[str, ActivationPeaks],
                 work_dir: Path) -> EmulatedRun:
    import numpy as np

    twin = emulation_twin(model, expose=True)
    path = work_dir / "fp16_emulated.onnx"
    # a large twin's weights go to a data file one tensor at a time; ORT maps that file instead of parsing a copy
    save_exposing(twin, path, [], external=model_bytes(twin) > STREAM_ABOVE_BYTES)
    del twin
    session = probe_session(path, in_order=True)  # each weight's Cast runs just before its reader
    names = [value.name for value in session.get_outputs()]
    graph_outputs = [value.name for value in model.graph.output]
    outputs, nonfinite = OutputStore(work_dir), set()
    for feed in feeds:
        arrays = as_arrays(names, session.run(None, feed))
        outputs.add({name: arrays[name] for name in graph_outputs})
        for name, array in arrays.items():
            tensor = name.removesuffix(NONFINITE_SUFFIX)  # a probe: NaN where its tensor held Inf or NaN
            known = stats.get(tensor)
            if np.issubdtype(array.dtype, np.floating) and not np.isfinite(array).all() \
                    and not (known is not None and known.nonfinite):
                nonfinite.add(tensor)
    return EmulatedRun(outputs=outputs.samples, nonfinite=nonfinite)


def overflow_births(model: onnx.ModelProto, bad: set[str], original_nodes: set[str], blocked: set[str],
                    stats: dict[str, ActivationPeaks]) -> list[KeptNode]:
    """Nodes to keep in float32 because Inf/NaN is born at them, at the float16 Cast feeding them, or (when
    the node already runs in float32) at the float16 rounding of what feeds it."""
    producers = {out: node for node in model.graph.node for out in node.output if out}
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for node in model.graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    found: dict[str, KeptNode] = {}
    for node in model.graph.node:
        born = [out for out in node.output if out in bad]
        if not born or any(name in bad for name in node.input):
            continue
        if node.name not in original_nodes:  # a Cast into float16 overflowed: its readers need float32
            targets = consumers.get(born[0], [])
        elif node.name in blocked:  # float32 already: the float16 values it reads are the cause
            targets = [_original_producer(name, producers, original_nodes) for name in node.input if name]
        else:
            targets = [node]
        for target in targets:
            if target is not None and target.name in original_nodes and target.name not in blocked \
                    and target.name not in found:
                source = stats.get(node.input[0]) if node.input else None
                found[target.name] = {"node": target.name, "op_type": target.op_type,
                                      "reason": f"Inf/NaN under float16 emulation at '{born[0]}'",
                                      "tensor": born[0], "abs_max": source.abs_max if source is not None else None}
    return list(found.values())


def _original_producer(name: str, producers: dict[str, onnx.NodeProto],
                       original_nodes: set[str]) -> onnx.NodeProto | None:
    """The original node behind a tensor, looking through inserted Casts."""
    node = producers.get(name)
    while node is not None and node.name not in original_nodes and node.op_type == "Cast":
        node = producers.get(node.input[0])
    return node


def summary(method: str, reference: list[dict[str, np.ndarray]], outputs: list[dict[str, np.ndarray]],
            tolerance: Tolerance, seconds: float, detections: Mapping[str, Any] | None = None) -> FidelityCheck:
    """A comparison against the float32 outputs, in findings form (a detector's boxes matched: ``detections``)."""
    return comparison_record(method, compare_outputs(reference, outputs, tolerance, detections=detections),
                             len(outputs), seconds)


def comparison_record(method: str, comparison: OutputComparison, samples: int, seconds: float) -> FidelityCheck:
    """A comparison already made, in findings form."""
    return {"method": method, "samples": samples, "passed": comparison.passed,
            "reasons": comparison.reasons, "worst": comparison.worst(), "seconds": round(seconds, 3)}


def reference_check(model: onnx.ModelProto, feeds: Feeds, reference: list[dict[str, np.ndarray]],
                    tolerance: Tolerance,
                    detections: Mapping[str, Any] | None = None) -> FidelityCheck | ReferenceUnavailable:
    """The artifact in onnx's reference evaluator (true float16 arithmetic) against float32 outputs.

    An op the evaluator cannot run makes the check ``unavailable`` with the op named, not a stage failure.
    """
    import numpy as np


    started = time.perf_counter()
    dtypes = {value.name: value.type.tensor_type.elem_type for value in model.graph.input}
    names = [value.name for value in model.graph.output]
    outputs = []
    try:
        evaluator = build_evaluator(model)
        with np.errstate(all="ignore"):
            for feed in feeds[:REFERENCE_SAMPLES]:
                cast = {name: array.astype(np.float16) if dtypes.get(name) == 10 else array
                        for name, array in feed.items()}
                results = run_evaluator(evaluator, cast)
                outputs.append({name: np.asarray(value).astype(np.float32)
                                if np.asarray(value).dtype == np.float16 else np.asarray(value)
                                for name, value in zip(names, results, strict=True)})
    except EvaluatorCannotRun as exc:
        log.info("fp16 reference check unavailable: %s", exc)
        return {"method": REFERENCE, "status": "unavailable", "passed": None, "reason": str(exc),
                "op_type": exc.op_type, "seconds": round(time.perf_counter() - started, 3)}
    return summary(REFERENCE, reference[:len(outputs)], outputs, tolerance, time.perf_counter() - started,
                   detections)
