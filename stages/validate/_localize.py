"""Where a failing artifact goes wrong: the first node whose output diverges from the reference.

Both models are run on the same inputs with their intermediate tensors exposed
as graph outputs; tensors are matched by name (names survive simplify, fp16 and
QDQ quantization mostly) and compared in the candidate's topological order.
The first matched tensor that breaks the limits, or holds NaN/Inf where the
reference is finite, names the node.

Matching through the lineage:

- fp16 (onnxconverter-common): Casts it inserts carry new names and are not
  compared; a divergence seen at the output of such a Cast is attributed to
  the node that fed it (a Gemm whose output was renamed for ``keep_io_types``).
- QDQ: a tensor ``X`` that a QuantizeLinear/DequantizeLinear pair follows is
  compared through the DequantizeLinear's output, the value its consumers see
  (ONNX Runtime's quantizer drops a Relu after Conv because the quantization
  clips, so ``X`` itself still holds negatives).
- Tensors only one side has (fused BatchNormalization, folded constants) are
  skipped; only the main graph is instrumented, not If/Loop bodies.

Exposing intermediates stops a runtime from fusing across them (ORT then runs
DequantizeLinear -> Conv -> QuantizeLinear in float instead of QLinearConv),
so the numbers located are those of the instrumented graph; the report says so.  Where that hides the error
(nothing located, or a node that diverges on ONNX Runtime too), ``_localize_fused`` compiles prefix
sub-models whole instead.
"""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

import numpy as np

from qdeploy.core.compare import compare_outputs
from qdeploy.core.onnx_wire import load_model
from qdeploy.core.tolerance import Tolerance
from qdeploy.graph.external_data import copy_exposing
from qdeploy.graph.selection import DATA_DEPENDENT_SELECTIONS
from qdeploy.stages.validate._common import feed_caster
from qdeploy.stages.validate._tolerance import is_integer_op
from qdeploy.targets import get_target

if TYPE_CHECKING:
    import onnx

log = logging.getLogger(__name__)

_CONVERSIONS = frozenset({"Cast", "QuantizeLinear", "DequantizeLinear", "CastLike"})
INSTRUMENTED_NOTE = ("intermediate outputs exposed, which can stop fusions: the located numbers are those of the "
                     "instrumented graph")

Feeds = Sequence[dict[str, np.ndarray]]
SELECTION_OPS = DATA_DEPENDENT_SELECTIONS | {"TopK", "ArgMax", "ArgMin"}
"""Ops that choose elements by comparing values: a near-tie decides, so their outputs jump where their inputs
barely moved (a detector's in-graph NMS keeps another box of two with almost equal scores); those of
``graph.selection`` also return as many as they choose."""


class DivergenceDict(TypedDict):
    """``Divergence.to_dict()``: the first diverging node as a row's ``divergence`` starts."""

    node: str
    op_type: str
    tensor: str
    max_abs_err: float | None
    cosine: float | None
    snr_db: float | None
    nonfinite: int
    reason: str
    compared: int


@dataclass
class Divergence:
    """The first node whose output breaks the limits; JSON-ready through ``to_dict``."""

    node: str
    op_type: str
    tensor: str
    max_abs_err: float | None
    cosine: float | None
    snr_db: float | None
    nonfinite: int
    reason: str
    compared: int
    """How many matched tensors were compared up to and including this one."""

    def to_dict(self) -> DivergenceDict:
        return DivergenceDict(**asdict(self))

    def summary(self) -> str:
        node = f"'{self.node}'" if self.node else "(unnamed)"
        said = f"first diverging node {node} ({self.op_type}), tensor '{self.tensor}': {self.reason}"
        if self.op_type in SELECTION_OPS:
            before = (f"the {self.compared - 1} tensors compared before it agree within the limits: "
                      if self.compared > 1 else "")
            said += (f"; {before}a selection by value flips where values nearly tie, and reduced precision moves "
                     "them; judge what it selects with a task metric (validate.metric), match the boxes a detector "
                     "keeps by IoU (validate.detections) or allow a share of it to differ (validate.outputs: "
                     "{name: {mismatch_max: ...}})")
        return said


@dataclass(frozen=True)
class TensorPair:
    """A reference tensor and where the candidate holds the same value, with the node to blame."""

    reference: str
    candidate: str
    node: str
    op_type: str


def match_tensors(reference: onnx.ModelProto, candidate: onnx.ModelProto) -> list[TensorPair]:
    """Tensors both graphs compute, in the candidate's topological order."""
    produced = {out for node in reference.graph.node for out in node.output if out}
    producers = {out: node for node in candidate.graph.node for out in node.output if out}
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for node in candidate.graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    pairs, seen = [], set()
    for node in candidate.graph.node:
        for out in node.output:
            if not out or out not in produced or out in seen:
                continue
            seen.add(out)
            blamed = _blamed_node(node, producers, produced)
            pairs.append(TensorPair(reference=out, candidate=_qdq_value(out, consumers), node=blamed.name,
                                    op_type=blamed.op_type))
    return pairs


def _qdq_value(name: str, consumers: dict[str, list[onnx.NodeProto]]) -> str:
    """The DequantizeLinear output of ``name -> QuantizeLinear -> DequantizeLinear``, else ``name``."""
    for quantize in consumers.get(name, []):
        if quantize.op_type != "QuantizeLinear" or quantize.input[0] != name:
            continue
        for dequantize in consumers.get(quantize.output[0], []):
            if dequantize.op_type == "DequantizeLinear" and dequantize.input[0] == quantize.output[0]:
                return dequantize.output[0]
    return name


def _blamed_node(node: onnx.NodeProto, producers: dict[str, onnx.NodeProto], produced: set[str]) -> onnx.NodeProto:
    """Walk back through inserted conversions (a Cast whose input the reference lacks) to the real producer."""
    current = node
    for _ in range(8):  # a chain of conversions is short; the bound guards against cycles in broken graphs
        if current.op_type not in _CONVERSIONS or not current.input or current.input[0] in produced:
            return current
        parent = producers.get(current.input[0])
        if parent is None:
            return current
        current = parent
    return current


def scale_free(tolerance: Tolerance, fallback: Tolerance) -> Tolerance:
    """The limits that mean the same on any tensor: cosine and SNR (atol/rtol depend on a tensor's scale)."""
    if tolerance.cosine_min is None and tolerance.snr_db_min is None:
        tolerance = fallback
    return Tolerance(cosine_min=tolerance.cosine_min, snr_db_min=tolerance.snr_db_min)


class Localizer:
    """Locates divergences against one reference model; its instrumented runs are cached per sample."""

    def __init__(self, reference_path: Path, reference_target: str) -> None:
        self.reference_path = Path(reference_path)
        self.reference_target = reference_target
        self._reference: onnx.ModelProto | None = None
        self._cache: dict[int, dict[str, np.ndarray]] = {}

    def locate(self, candidate_path: Path, target: str, feeds: dict[int, dict[str, np.ndarray]], *,
               tolerance: Tolerance, pin_f32: bool) -> tuple[Divergence | None, str]:
        """The first diverging node on these samples (index -> feed), or None and why not."""
        reference = self._reference_model()
        candidate = load_model(candidate_path, load_external_data=False)  # the graph: names are what is matched
        pairs = match_tensors(reference, candidate)
        if not pairs:
            return None, "no intermediate tensor of the artifact shares a name with the reference"
        with tempfile.TemporaryDirectory(prefix="qdeploy-localize-") as work:
            wanted = [pair.candidate for pair in pairs]
            path = _instrumented(candidate_path, wanted, Path(work) / "candidate.onnx")
            candidate_outputs = _run(path, target, [feeds[i] for i in sorted(feeds)], pin_f32=pin_f32)
            reference_outputs = self._reference_outputs(feeds, Path(work))
        return _first_divergence(pairs, reference_outputs, candidate_outputs, tolerance)

    def reference_model(self) -> onnx.ModelProto:
        """The reference's graph (no weights), read once."""
        return self._reference_model()

    def reference_outputs(self, feeds: dict[int, dict[str, np.ndarray]], work: Path) -> list[dict[str, np.ndarray]]:
        """Every tensor of the reference on these samples (index -> feed), in index order; cached per sample."""
        return self._reference_outputs(feeds, work)

    def _reference_model(self) -> onnx.ModelProto:
        if self._reference is None:
            self._reference = load_model(self.reference_path, load_external_data=False)
        return self._reference

    def _reference_outputs(self, feeds: dict[int, dict[str, np.ndarray]], work: Path) -> list[dict[str, np.ndarray]]:
        missing = [index for index in sorted(feeds) if index not in self._cache]
        if missing:
            model = self._reference_model()
            names = [out for node in model.graph.node for out in node.output if out]
            path = _instrumented(self.reference_path, names, work / "reference.onnx")
            outputs = _run(path, self.reference_target, [feeds[i] for i in missing], pin_f32=True)
            self._cache.update(zip(missing, outputs, strict=True))
        return [self._cache[index] for index in sorted(feeds)]


def _instrumented(source: Path, tensors: list[str], path: Path) -> Path:
    """A copy of the model saved at ``source`` with these tensors added as graph outputs (untyped: runtimes infer
    them), its weights copied file to file (neither model is held whole in memory)."""
    import onnx


    copy_exposing(source, path, [onnx.ValueInfoProto(name=name) for name in dict.fromkeys(tensors)])
    return path


def _run(path: Path, target: str, feeds: Feeds, *, pin_f32: bool) -> list[dict[str, np.ndarray]]:
    cast = feed_caster(path)
    with get_target(target).load(path, pin_f32=pin_f32) as session:
        return [session.run(cast(feed)) for feed in feeds]


def _first_divergence(pairs: list[TensorPair], reference: list[dict[str, np.ndarray]],
                      candidate: list[dict[str, np.ndarray]], tolerance: Tolerance) -> tuple[Divergence | None, str]:
    compared = 0
    for pair in pairs:
        refs = [{pair.reference: sample[pair.reference]} for sample in reference if pair.reference in sample]
        cands = [{pair.reference: sample[pair.candidate]} for sample in candidate if pair.candidate in sample]
        if is_integer_op(pair.op_type):  # quantized levels, not indices: a level off at a rounding tie is rounding
            refs, cands = _as_levels(refs, pair.reference), _as_levels(cands, pair.reference)
        if not refs or len(refs) != len(cands) or not _comparable(refs, cands, pair.reference):
            continue
        compared += 1
        result = compare_outputs(refs, cands, tolerance)
        if result.passed:
            continue
        metrics = result.outputs[0]
        reason = "; ".join(r.removeprefix(f"output '{pair.reference}': ") for r in result.reasons)
        return Divergence(node=pair.node, op_type=pair.op_type, tensor=pair.reference,
                          max_abs_err=metrics.max_abs_err, cosine=metrics.cosine, snr_db=metrics.snr_db,
                          nonfinite=metrics.nonfinite, reason=reason, compared=compared), ""
    return None, (f"none of the {compared} intermediate tensors shared with the reference breaks "
                  f"{tolerance.model_dump(exclude_none=True)}: the error builds up gradually or sits in tensors "
                  "only one model has")


def _as_levels(samples: list[dict[str, np.ndarray]], name: str) -> list[dict[str, np.ndarray]]:
    """An integer op's output as float32 numbers, compared with the float limits like any activation: two runtimes
    quantizing one tensor round a value at a tie, or one a hair apart, to neighbouring levels (1 of 128,000
    elements of Whisper features, ORT against OpenVINO), which is not where a model diverges.  Index tensors
    (Shape, ArgMax, TopK's) come from other ops and stay exact."""
    return [{name: np.asarray(sample[name]).astype(np.float32)} for sample in samples]


def _comparable(refs: list[dict[str, np.ndarray]], cands: list[dict[str, np.ndarray]], name: str) -> bool:
    """Same shapes and both floating point (an integer index tensor is compared only if both are integer)."""
    for ref, cand in zip(refs, cands, strict=True):
        r, c = np.asarray(ref[name]), np.asarray(cand[name])
        if r.shape != c.shape or (r.dtype.kind == "f") != (c.dtype.kind == "f"):
            return False
        if np.count_nonzero(~np.isfinite(r)) if r.dtype.kind == "f" else False:
            return False  # the reference itself overflows here; nothing to blame the candidate for
    return True
