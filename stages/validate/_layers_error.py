"""Where the error comes from, node by node: each tensor the candidate shares with the float32 reference, compared
on the validation samples (SNR, cosine), with the localizer's machinery (``_localize``: tensors matched through
Casts and Q/DQ pairs, both models instrumented by exposing their intermediate tensors).

Exposing a tensor can stop the runtime from fusing across it (ORT then runs DequantizeLinear -> Conv ->
QuantizeLinear in float instead of QLinearConv; OpenVINO keeps the exposed tensor in float).  So the candidate is
also run as it ships, and its final outputs are compared with the instrumented run's: where they differ, the
per-node numbers may not be those of the shipped graph, and the result says so (``exposure``).
"""

from __future__ import annotations

import logging
import math
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TypedDict

import numpy as np

from qdeploy.core.compare import SNR_CAP_DB
from qdeploy.core.onnx_wire import load_model
from qdeploy.stages.validate._localize import Localizer, _comparable, _instrumented, _run, match_tensors
from qdeploy.stages.validate.config import REFERENCE_TARGET

__all__ = ["LayerErrors", "LayerErrorsDict", "NodeErrorRecord", "OutputExposure", "TensorErrorMetrics", "layer_errors",
           "tensor_metrics"]

log = logging.getLogger(__name__)


class TensorErrorMetrics(TypedDict):
    """One tensor against the reference's over the samples (``tensor_metrics``); None where nothing finite was
    compared."""

    snr_db: float | None
    cosine: float | None
    max_abs_err: float | None
    nonfinite: int


class NodeErrorRecord(TensorErrorMetrics):
    """One node's output against the reference's same tensor (``LayerErrors.per_node``): the tensor, the op type,
    then the metrics."""

    tensor: str
    op_type: str


class OutputExposure(TypedDict):
    """Whether exposing the intermediate tensors changed the candidate's final outputs (``LayerErrors.exposure``)."""

    changed: bool
    max_output_difference: float | None
    note: str


class LayerErrorsDict(TypedDict):
    """``LayerErrors.to_dict()``."""

    per_node: dict[str, NodeErrorRecord]
    shapes: dict[str, list[int]]
    exposure: OutputExposure | None
    samples: int


@dataclass
class LayerErrors:
    """Per ONNX node: its output against the reference's same tensor; the reference's tensor shapes (sample 0);
    whether exposing the tensors changed the candidate's final outputs."""

    per_node: dict[str, NodeErrorRecord] = field(default_factory=dict)
    shapes: dict[str, list[int]] = field(default_factory=dict)
    exposure: OutputExposure | None = None
    """None until measured (``layer_errors`` always measures it)."""
    samples: int = 0

    def to_dict(self) -> LayerErrorsDict:
        return LayerErrorsDict(**asdict(self))


def layer_errors(reference_path: Path, candidate_path: Path, target: str, feeds: list[dict[str, np.ndarray]], *,
                 pin_f32: bool, shipped: list[dict[str, np.ndarray]] | None = None) -> LayerErrors:
    """Each shared tensor's SNR and cosine against the reference on ``feeds``; the node is the one to blame (the
    producer behind inserted Casts and Q/DQ).  ``shipped``: the candidate's own outputs on ``feeds`` where the
    caller has them (else it is run once more)."""
    localizer = Localizer(reference_path, REFERENCE_TARGET)
    candidate = load_model(candidate_path, load_external_data=False)
    finals = [value.name for value in candidate.graph.output]
    with tempfile.TemporaryDirectory(prefix="qdeploy-layers-error-") as folder:
        work = Path(folder)
        reference = localizer.reference_outputs(dict(enumerate(feeds)), work)
        first = reference[0] if reference else {}
        # float tensors only: shape arithmetic is folded away by OpenVINO, which then has no such output
        pairs = [pair for pair in match_tensors(localizer.reference_model(), candidate)
                 if pair.reference in first and np.asarray(first[pair.reference]).dtype.kind == "f"]
        exposed = _run(_instrumented(candidate_path, [pair.candidate for pair in pairs], work / "candidate.onnx"),
                       target, feeds, pin_f32=pin_f32)
        if shipped is None:
            shipped = _run(candidate_path, target, feeds, pin_f32=pin_f32)
    errors = LayerErrors(samples=len(feeds), exposure=_exposure(shipped, exposed, finals, target))
    errors.shapes = {name: list(np.shape(value)) for name, value in first.items()}
    for pair in pairs:
        refs = [{pair.reference: sample[pair.reference]} for sample in reference if pair.reference in sample]
        cands = [{pair.reference: sample[pair.candidate]} for sample in exposed if pair.candidate in sample]
        if not refs or len(refs) != len(cands) or not _comparable(refs, cands, pair.reference):
            continue
        record: NodeErrorRecord = {"tensor": pair.reference, "op_type": pair.op_type,
                  **tensor_metrics([r[pair.reference] for r in refs], [c[pair.reference] for c in cands])}
        known = errors.per_node.get(pair.node)
        if known is None or _worse(record, known):  # a node with several outputs: its worst one
            errors.per_node[pair.node] = record
    return errors


def tensor_metrics(refs: list[np.ndarray], cands: list[np.ndarray]) -> TensorErrorMetrics:
    """SNR, cosine and max abs error of one tensor over the samples, as ``qdeploy.core.compare`` defines them (SNR
    capped at SNR_CAP_DB), with NaN/Inf counted where the reference is finite and left out of the others.
    compare_outputs computes every metric of every output (40 ms a tensor here); a model has hundreds."""
    ref = np.concatenate([np.asarray(r, np.float64).ravel() for r in refs])
    cand = np.concatenate([np.asarray(c, np.float64).ravel() for c in cands])
    ref_finite, cand_finite = np.isfinite(ref), np.isfinite(cand)
    nonfinite = int(np.count_nonzero(ref_finite & ~cand_finite))
    if not (ref_finite.all() and cand_finite.all()):
        ref, cand = ref[ref_finite & cand_finite], cand[ref_finite & cand_finite]
    if not ref.size:
        return {"snr_db": None, "cosine": None, "max_abs_err": None, "nonfinite": nonfinite}
    err = cand - ref
    signal, noise = _dot(ref, ref), _dot(err, err)
    snr = SNR_CAP_DB if noise == 0 else -SNR_CAP_DB if signal == 0 else \
        float(np.clip(10 * np.log10(signal / noise), -SNR_CAP_DB, SNR_CAP_DB))
    norms = math.sqrt(signal * _dot(cand, cand))
    cosine = _dot(ref, cand) / norms if norms else (1.0 if noise == 0 else 0.0)
    return {"snr_db": snr, "cosine": cosine, "max_abs_err": float(np.abs(err).max()), "nonfinite": nonfinite}


def _dot(a: np.ndarray, b: np.ndarray) -> float:
    """einsum, not BLAS: a BLAS dot spins up its threads per call (27 ms against 0.2 ms here on a busy CPU)."""
    return float(np.einsum("i,i->", a, b))


def _exposure(shipped: list[dict[str, np.ndarray]], exposed: list[dict[str, np.ndarray]], finals: list[str],
              target: str) -> OutputExposure:
    """Whether the instrumented run's final outputs differ from the shipped graph's (fusions undone)."""
    largest = 0.0
    for plain, instrumented in zip(shipped, exposed, strict=False):
        for name in finals:
            if name in plain and name in instrumented and np.shape(plain[name]) == np.shape(instrumented[name]):
                a, b = np.asarray(plain[name], np.float64), np.asarray(instrumented[name], np.float64)
                with np.errstate(invalid="ignore"):
                    diff = np.nanmax(np.abs(a - b)) if a.size else 0.0
                largest = max(largest, float(diff) if np.isfinite(diff) else float("inf"))
    changed = largest > 0.0
    note = (f"exposing the intermediate tensors changed the final outputs on {target} (max difference "
            f"{largest:.3g}): fusions were undone, so the per-node errors may differ from the shipped graph's"
            if changed else f"exposing the intermediate tensors left the final outputs on {target} unchanged")
    return {"changed": changed, "max_output_difference": largest if np.isfinite(largest) else None, "note": note}


def _worse(record: NodeErrorRecord, known: NodeErrorRecord) -> bool:
    new, old = record["snr_db"], known["snr_db"]
    return new is not None and (old is None or new < old)
