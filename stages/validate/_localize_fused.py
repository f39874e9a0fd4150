"""Where a failing artifact goes wrong when the error lives inside a runtime's fusions.

``_localize`` exposes every intermediate tensor as an output; a runtime then
cannot fuse across them, and an error that only a fusion makes (OpenVINO's
low-precision passes rewriting a dequantization, a Q/DQ pair folded into a
kernel) vanishes: "not located".  Here the candidate is cut instead: a prefix
sub-model holds the nodes up to a cut in topological order and exposes only the
tensors crossing the cut that the reference also computes, and it is compiled
whole on the failing target, so everything before the cut fuses as it does in
deployment.  Its tensors are compared with the reference's on ``ort:cpu``
(the float values ``_localize`` caches); tensors that already break the limits
when the candidate runs on ``ort:cpu`` with every intermediate exposed are left
out (plain quantization error, not the target's).  The first cut whose prefix
diverges is found by bisection: 1 + ceil(log2(cuts)) compiles, plus one
instrumented run of the candidate on ``ort:cpu``.  The bisection assumes an
error, once made, reaches the next cut's crossing tensors (true along chains;
with parallel branches a later cut can hide an earlier branch's error behind
a node the reference does not share).

On OpenVINO the executed graph of the diverging prefix names the fused layer
that holds the node (``originalLayersNames`` of its runtime model).
"""

from __future__ import annotations

import logging
import math
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

import numpy as np

from qdeploy.core.compare import compare_outputs
from qdeploy.core.onnx_wire import load_model
from qdeploy.graph.external_data import save_onnx
from qdeploy.graph.utils import subgraph_references
from qdeploy.stages.validate._common import feed_caster
from qdeploy.stages.validate._localize import (
    INSTRUMENTED_NOTE,
    Divergence,
    Localizer,
    TensorPair,
    _comparable,
    _instrumented,
    _run,
    match_tensors,
)
from qdeploy.targets import get_target

if TYPE_CHECKING:
    import onnx

    from qdeploy.core.tolerance import Tolerance

log = logging.getLogger(__name__)

BASELINE_TARGET = "ort:cpu"
"""Where the candidate runs instrumented to tell plain quantization error from the target's own."""
FUSED_NOTE = ("located on prefix sub-models compiled whole on the target (its fusions kept up to the cut), "
              "compared with the reference on ort:cpu")


@dataclass
class _Cut:
    """A prefix of the candidate: nodes ``[0, end]`` and the matched tensors that cross the cut."""

    end: int
    pairs: list[TensorPair]


class ExecutedLayer(TypedDict):
    """One layer of OpenVINO's executed graph and the original nodes it fused (``fused_layer`` of a row)."""

    name: str
    type: str
    precision: str
    original_layers: list[str]


class FusedSearchCost(TypedDict):
    """What the prefix bisection cost (``divergence.localized_by``)."""

    method: str
    cuts: int
    compiles: int
    compile_bound: int
    baseline_runs: int
    left_out_diverging_on_ort: int
    seconds: float


class LocalizationMethod(TypedDict):
    """How a divergence was localized, where no search cost is kept (``divergence.localized_by``)."""

    method: str


class LocalizationFields(TypedDict, total=False):
    """The fields a localization adds to a row's ``divergence``: how it was localized, what that means, and (the
    fused search on OpenVINO) the executed layer holding the node."""

    localized_by: FusedSearchCost | LocalizationMethod
    note: str
    fused_layer: ExecutedLayer | None


@dataclass
class FusedSearch:
    """What the bisection cost and found."""

    cuts: int = 0
    compiles: int = 0
    baseline_runs: int = 0
    seconds: float = 0.0
    left_out: int = 0
    """Tensors left out because they break the limits on ort:cpu too."""
    layer: ExecutedLayer | None = None
    layers: dict[int, list[ExecutedLayer]] = field(default_factory=dict)

    def cost(self) -> FusedSearchCost:
        return {"method": "prefix bisection", "cuts": self.cuts, "compiles": self.compiles,
                "compile_bound": 1 + math.ceil(math.log2(max(self.cuts, 1))),
                "baseline_runs": self.baseline_runs, "left_out_diverging_on_ort": self.left_out,
                "seconds": round(self.seconds, 3)}


def locate_fused(localizer: Localizer, candidate_path: Path, target: str, feeds: dict[int, dict[str, np.ndarray]],
                 *, tolerance: Tolerance, pin_f32: bool) -> tuple[Divergence | None, LocalizationFields, str]:
    """The first node whose output diverges on ``target`` with its fusions kept: the divergence, what the search
    cost (and the fused layer holding the node, on OpenVINO), or None and why not."""
    started = time.perf_counter()
    search = FusedSearch()
    with tempfile.TemporaryDirectory(prefix="qdeploy-localize-fused-") as folder:
        work = Path(folder)
        divergence, why = _search(localizer, candidate_path, target, feeds, tolerance, pin_f32, search, work)
    search.seconds = time.perf_counter() - started
    found: LocalizationFields = {"localized_by": search.cost(), "note": FUSED_NOTE}
    if divergence is not None:
        found["fused_layer"] = search.layer
    return divergence, found, why


def _search(localizer: Localizer, candidate_path: Path, target: str, feeds: dict[int, dict[str, np.ndarray]],
            tolerance: Tolerance, pin_f32: bool, search: FusedSearch, work: Path) -> tuple[Divergence | None, str]:
    candidate = load_model(candidate_path)  # with its weights: prefixes are saved as models of their own
    pairs = match_tensors(localizer.reference_model(), candidate)
    if not pairs:
        return None, "no intermediate tensor of the artifact shares a name with the reference"
    samples = [feeds[i] for i in sorted(feeds)]
    reference = localizer.reference_outputs(feeds, work)
    if target != BASELINE_TARGET:
        pairs = _without_baseline_divergence(candidate_path, pairs, samples, reference, tolerance, search)
    cuts = _cuts(candidate, pairs)
    search.cuts = len(cuts)
    if not cuts:
        return None, "every shared tensor breaks the limits on ort:cpu too: plain quantization error"

    def diverging(index: int) -> Divergence | None:
        return _run_cut(candidate, cuts[index], index, target, samples, reference, tolerance, pin_f32, search, work)

    last = diverging(len(cuts) - 1)
    if last is None:
        return None, (f"no prefix cut at the {len(cuts)} shared tensors diverges when compiled whole on {target}: "
                      "the error sits after the last tensor the reference shares")
    low, high, found = 0, len(cuts) - 1, last  # invariant: the prefix ending at cut `high` diverges
    while low < high:
        middle = (low + high) // 2
        result = diverging(middle)
        if result is None:
            low = middle + 1
        else:
            high, found = middle, result
    search.layer = _fused_layer(search.layers.get(high, []), found.node, candidate, cuts[high])
    found.compared = high + 1  # the cut it appears at, counted in topological order
    return found, ""


def _without_baseline_divergence(candidate_path: Path, pairs: list[TensorPair], samples: list[dict[str, np.ndarray]],
                                 reference: list[dict[str, np.ndarray]], tolerance: Tolerance,
                                 search: FusedSearch) -> list[TensorPair]:
    """The pairs whose tensors hold the limits when the candidate runs on ort:cpu with every tensor exposed."""
    with tempfile.TemporaryDirectory(prefix="qdeploy-localize-baseline-") as folder:
        path = _instrumented(candidate_path, [pair.candidate for pair in pairs], Path(folder) / "baseline.onnx")
        baseline = _run(path, BASELINE_TARGET, samples, pin_f32=True)
    search.baseline_runs += 1
    kept = [pair for pair in pairs if not _breaks(pair, reference, baseline, tolerance)]
    search.left_out = len(pairs) - len(kept)
    return kept


def _cuts(candidate: onnx.ModelProto, pairs: list[TensorPair]) -> list[_Cut]:
    """One cut per node producing a matched tensor, in topological order, each with the matched tensors that
    cross it (read after the cut, or graph outputs)."""
    position = {out: index for index, node in enumerate(candidate.graph.node) for out in node.output if out}
    last_read: dict[str, int] = {}
    for index, node in enumerate(candidate.graph.node):
        for name in node.input:
            last_read[name] = index
    outputs = {value.name for value in candidate.graph.output}
    # by position alone: a node with two matched outputs (a Split) ties, and pairs do not order
    located = sorted(((position[pair.candidate], pair) for pair in pairs if pair.candidate in position),
                     key=lambda item: item[0])
    cuts = []
    for end in sorted({index for index, _ in located}):
        crossing = [pair for index, pair in located if index <= end
                    and (index == end or last_read.get(pair.candidate, -1) > end or pair.candidate in outputs)]
        cuts.append(_Cut(end=end, pairs=crossing))
    return cuts


def _run_cut(candidate: onnx.ModelProto, cut: _Cut, index: int, target: str, samples: list[dict[str, np.ndarray]],
             reference: list[dict[str, np.ndarray]], tolerance: Tolerance, pin_f32: bool, search: FusedSearch,
             work: Path) -> Divergence | None:
    """Compile the prefix ending at ``cut`` on the target, run the samples, and return its first diverging pair."""
    model = prefix_model(candidate, cut.end, [pair.candidate for pair in cut.pairs])
    path = work / f"prefix_{index}" / "prefix.onnx"
    save_onnx(model, path)
    inputs = {value.name for value in model.graph.input}
    cast = feed_caster(path)
    search.compiles += 1
    with get_target(target).load(path, pin_f32=pin_f32) as session:
        outputs = [session.run(cast({k: v for k, v in feed.items() if k in inputs})) for feed in samples]
        search.layers[index] = executed_layers(session)
    for pair in sorted(cut.pairs, key=lambda p: p is not cut.pairs[-1]):  # the cut's own tensor first
        divergence = _breaks(pair, reference, outputs, tolerance)
        if divergence:
            log.debug("prefix %d (%d nodes) on %s diverges at %s", index, cut.end + 1, target, pair.candidate)
            return divergence
    return None


def _breaks(pair: TensorPair, reference: list[dict[str, np.ndarray]], candidate: list[dict[str, np.ndarray]],
            tolerance: Tolerance) -> Divergence | bool | None:
    """The pair's divergence; None when it holds the limits, False when it cannot be compared."""
    refs = [{pair.reference: sample[pair.reference]} for sample in reference if pair.reference in sample]
    cands = [{pair.reference: sample[pair.candidate]} for sample in candidate if pair.candidate in sample]
    if not refs or len(refs) != len(cands) or not _comparable(refs, cands, pair.reference):
        return False
    result = compare_outputs(refs, cands, tolerance)
    if result.passed:
        return None
    metrics = result.outputs[0]
    reason = "; ".join(r.removeprefix(f"output '{pair.reference}': ") for r in result.reasons)
    return Divergence(node=pair.node, op_type=pair.op_type, tensor=pair.reference, max_abs_err=metrics.max_abs_err,
                      cosine=metrics.cosine, snr_db=metrics.snr_db, nonfinite=metrics.nonfinite, reason=reason,
                      compared=0)


def prefix_model(model: onnx.ModelProto, end: int, outputs: list[str]) -> onnx.ModelProto:
    """The nodes ``[0, end]`` that the ``outputs`` depend on, as a model of its own (the graph inputs and
    initializers they read, untyped outputs: runtimes infer them)."""
    import onnx
    from onnx import helper


    needed = set(outputs)
    kept: list[onnx.NodeProto] = []
    for node in reversed(model.graph.node[: end + 1]):
        if any(out in needed for out in node.output):
            kept.append(node)
            needed.update(name for name in node.input if name)
            inner = onnx.GraphProto()
            inner.node.extend([node])
            needed |= subgraph_references(inner)  # outer names an If/Loop body reads
    kept.reverse()
    initializers = [init for init in model.graph.initializer if init.name in needed]
    constants = {init.name for init in initializers}
    inputs = [value for value in model.graph.input if value.name in needed and value.name not in constants]
    graph = helper.make_graph(kept, f"{model.graph.name}_prefix", inputs,
                              [onnx.ValueInfoProto(name=name) for name in dict.fromkeys(outputs)], initializers)
    graph.value_info.extend(value for value in model.graph.value_info if value.name in needed)
    prefix = helper.make_model(graph, opset_imports=list(model.opset_import), ir_version=model.ir_version)
    prefix.functions.extend(model.functions)
    return prefix


def executed_layers(session: Any) -> list[ExecutedLayer]:
    """OpenVINO's executed graph: each layer's name, type, precision and the original nodes it fused; empty on
    other runtimes (only an OpenVINO session has a ``compiled_model``)."""
    compiled = getattr(session, "compiled_model", None)
    if compiled is None:
        return []
    layers: list[ExecutedLayer] = []
    try:
        ops = compiled.get_runtime_model().get_ordered_ops()
    except Exception as exc:  # a diagnosis: the located node stands without its layer
        log.debug("runtime model unavailable: %s", exc)
        return []
    for op in ops:
        info = op.get_rt_info()

        def text(key: str, info: Any = info) -> str:
            return info[key].astype(str) if key in info else ""

        names = [name for name in text("originalLayersNames").split(",") if name]
        if names:
            layers.append({"name": op.get_friendly_name(), "type": text("layerType"),
                           "precision": text("runtimePrecision"), "original_layers": names})
    return layers


def _fused_layer(layers: list[ExecutedLayer], node: str, candidate: onnx.ModelProto,
                 cut: _Cut) -> ExecutedLayer | None:
    """The executed layer holding the node, else the one holding the cut's producer (a DequantizeLinear after it)."""
    fallback = candidate.graph.node[cut.end].name
    for wanted in (node, fallback):
        for layer in layers:
            if wanted and wanted in layer["original_layers"]:
                return layer
    return None


def refine(localizer: Localizer, candidate_path: Path, target: str, feeds: dict[int, dict[str, np.ndarray]],
           located: Divergence | None, why: str, *, tolerance: Tolerance,
           pin_f32: bool) -> tuple[Divergence | None, LocalizationFields, str]:
    """The instrumented search's answer, or the fused search's where that one cannot be trusted: nothing found
    (exposing the tensors may have undone the fusion at fault), or a node that diverges on ort:cpu as well (plain
    quantization error, not what fails on this target).  Returns the divergence, the fields its record adds
    (``note``, and ``localized_by``/``fused_layer`` from the fused search), and why nothing was found."""
    instrumented: LocalizationFields = {"note": INSTRUMENTED_NOTE, "localized_by": {"method": "intermediates exposed"}}
    runtime = target.split(":", 1)[0]
    if runtime == "reference":  # qdeploy's own evaluator runs node by node: nothing fuses
        return located, instrumented, why
    if located is not None and (runtime == "ort" or not _diverges_on_baseline(
            localizer, candidate_path, located, feeds, tolerance)):
        return located, instrumented, why
    try:
        divergence, found, fused_why = locate_fused(localizer, candidate_path, target, feeds, tolerance=tolerance,
                                                    pin_f32=pin_f32)
    except Exception as exc:  # a prefix the target cannot compile: the instrumented answer stands
        log.debug("fused localization on %s failed", target, exc_info=True)
        divergence, found, fused_why = None, {"localized_by": {"method": "prefix bisection"}}, \
            f"a prefix sub-model failed: {type(exc).__name__}: {exc}"
    if divergence is not None:
        return divergence, found, ""
    if located is not None:  # the fused search found nothing better: the instrumented answer, said for what it is
        note = f"{INSTRUMENTED_NOTE}; the node diverges on {BASELINE_TARGET} too, and {fused_why}"
        return located, {"note": note, "localized_by": found["localized_by"]}, why
    return None, found, f"{why}; compiled whole: {fused_why}" if why else fused_why


def _diverges_on_baseline(localizer: Localizer, candidate_path: Path, located: Divergence,
                          feeds: dict[int, dict[str, np.ndarray]], tolerance: Tolerance) -> bool:
    """Whether the located tensor breaks the limits when the candidate runs on ort:cpu too."""
    pair = next((pair for pair in match_tensors(localizer.reference_model(),
                                                load_model(candidate_path, load_external_data=False))
                 if pair.reference == located.tensor), None)
    if pair is None:
        return False
    samples = [feeds[i] for i in sorted(feeds)]
    with tempfile.TemporaryDirectory(prefix="qdeploy-localize-baseline-") as folder:
        work = Path(folder)
        path = _instrumented(candidate_path, [pair.candidate], work / "baseline.onnx")
        baseline = _run(path, BASELINE_TARGET, samples, pin_f32=True)
        reference = localizer.reference_outputs(feeds, work)
    return bool(_breaks(pair, reference, baseline, tolerance))


def describe_layer(layer: ExecutedLayer | None) -> str:
    """What the row's reason adds about the fused layer: empty when none was named."""
    if not layer:
        return ""
    fused = layer["original_layers"]
    more = f" with {', '.join(fused[:4])}{' ...' if len(fused) > 4 else ''}" if len(fused) > 1 else ""
    return f", fused in OpenVINO layer '{layer['name']}' ({layer['type']}, {layer['precision']}){more}"
