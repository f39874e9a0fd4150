"""Activation-aware blocking: which nodes would overflow float16 on real inputs, and by how much.

The float32 model runs in ONNX Runtime on the calibration data; each float tensor
of the main graph's largest magnitude, largest value and shape are recorded
(computed in the graph by ``_peak_probes``, so a run holds one activation at a time).
A node stays float32 when a predicted worst case (measured value stretched by the
recipe's safety margin) passes float16's largest finite value.  How a value stretches depends on the op:

- any node: its inputs and outputs grow linearly: ``abs_max / margin``;
- Pow with a constant exponent e > 1, and Mul of a tensor by itself (e = 2): ``(base_abs_max / margin) ** e``;
- Exp: ``exp(max(x, 0) / margin)``;
- ReduceMean (and ReduceL2/LogSumExp) hold a sum in their accumulator:
  ``|mean| * N / margin`` over the N reduced elements, so long axes overflow first;
- attention scores (MatMul -> [scale, mask] -> Softmax) grow with the product of two
  activations: ``abs_max / margin**2`` on every tensor of that chain; the whole chain stays
  float32 together, so an overflowing score never passes through a float16 Cast.
"""

from __future__ import annotations

import logging
import math
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

from qdeploy.core.compare import as_arrays
from qdeploy.core.output_store import OutputStore
from qdeploy.core.values import finite_or
from qdeploy.graph.external_data import save_exposing
from qdeploy.graph.utils import default_opset, moved_weights
from qdeploy.stages.fp16._graph import FLOAT
from qdeploy.stages.fp16._peak_probes import PROBE_MIN_OPSET, PeakNames, add_peak_probes, names_taken, peaks_of

if TYPE_CHECKING:
    import numpy as np
    import onnx

log = logging.getLogger(__name__)

SCORE_OPS = frozenset({"MatMul", "Gemm", "Einsum"})
"""Ops that make attention scores from two activations."""
SCORE_PATH_OPS = frozenset({"Add", "Sub", "Mul", "Div", "Where", "Reshape", "Transpose", "Cast", "Identity",
                            "Squeeze", "Unsqueeze", "Expand", "Clip", "Max", "Min"})
"""Ops allowed between the scores and the Softmax (scale, mask, reshapes)."""
SCALE_OPS = frozenset({"Mul", "Div"})
SOFTMAX_OPS = frozenset({"Softmax", "LogSoftmax"})
ACCUMULATING_REDUCTIONS = frozenset({"ReduceMean", "ReduceL2", "ReduceLogSumExp"})


@dataclass
class ActivationPeaks:
    """What a float tensor held over the calibration data."""

    abs_max: float
    max: float
    shape: tuple[int, ...]
    nonfinite: bool = False


@dataclass
class Float32Run:
    """The float32 model's graph outputs per sample and the statistics of its float tensors."""

    outputs: list[Mapping[str, np.ndarray]]
    stats: dict[str, ActivationPeaks]


def run_float32(model: onnx.ModelProto, feeds: Iterable[dict[str, np.ndarray]], work_dir: Path, *,
                big: bool = False) -> Float32Run:
    """Run the float32 model in ORT (no graph optimisation) and record every main-graph float tensor's peaks:
    from probes computed in the graph (``_peak_probes``), or, below opset 10, from the tensors themselves."""
    import numpy as np

    outputs = [value.name for value in model.graph.output]
    exposed = set(outputs)
    # a weight's Transpose is as big as the weight, and its probe's intermediates as big again (0.4 GB on a tied
    # 49k x 576 embedding): its peaks are read from the weight, once, not probed on every sample
    stats: dict[str, ActivationPeaks] = {}
    moved = moved_weights(model.graph)
    _weight_peaks(model, moved, work_dir, stats)
    extra = []
    for value in model.graph.value_info:
        if value.type.tensor_type.elem_type == FLOAT and value.name not in exposed and value.name not in moved:
            extra.append(value)
            exposed.add(value.name)
    probes: dict[str, PeakNames] = {}
    if default_opset(model) >= PROBE_MIN_OPSET and not names_taken(model.graph):
        watched, extra = [value.name for value in extra], []
        session = _session(model, [], work_dir / "fp16_probe.onnx", big,
                           edit=lambda graph: probes.update(add_peak_probes(graph, watched)))
    else:
        session = _session(model, extra, work_dir / "fp16_probe.onnx", big)
    names = [out.name for out in session.get_outputs()]
    results = OutputStore(work_dir)  # a language model's logits wait on disk, not beside the stage's sessions
    for feed in feeds:
        arrays = as_arrays(names, session.run(None, feed))
        results.add({name: arrays[name] for name in outputs})
        for name, array in [*((name, arrays[name]) for name in names if name in exposed), *feed.items()]:
            if array.size and np.issubdtype(array.dtype, np.floating):
                _update(stats, name, array)
        for name, probe in probes.items():
            _record(stats, name, peaks_of(arrays, probe))
    return Float32Run(outputs=results.samples, stats=stats)


def _weight_peaks(model: onnx.ModelProto, moved: dict[str, str], folder: Path,
                  stats: dict[str, ActivationPeaks]) -> None:
    """The peaks of each rearranged float weight (``moved_weights``), from the weight's values (its data file, if
    any, in ``folder``), one weight in memory at a time; a weight that cannot be read here leaves ``moved`` (its
    rearrangements are probed like activations)."""
    from onnx import numpy_helper

    shapes = {value.name: value.type.tensor_type.shape for value in model.graph.value_info}
    weights = {tensor.name: tensor for tensor in model.graph.initializer if tensor.data_type == FLOAT}
    for origin in list(dict.fromkeys(moved.values())):
        try:
            values = numpy_helper.to_array(weights[origin], base_dir=str(folder))
        except (KeyError, OSError, ValueError):  # not a float weight, or its bytes not here: probe it after all
            for name in [name for name, source in moved.items() if source == origin]:
                del moved[name]
            continue
        for name in (name for name, source in moved.items() if source == origin):
            dims = [dim.dim_value for dim in shapes[name].dim] if name in shapes else []
            shape = tuple(dims) if dims and all(dims) else values.shape  # a rearrangement keeps the count
            if values.size:
                _update(stats, name, values.reshape(shape) if math.prod(shape) == values.size else values)
        del values


def _update(stats: dict[str, ActivationPeaks], name: str, array: np.ndarray) -> None:
    import numpy as np

    finite = array[np.isfinite(array)]
    abs_max = float(np.abs(finite).max()) if finite.size else 0.0
    top = float(finite.max()) if finite.size else 0.0
    _record(stats, name, (abs_max, top, finite.size != array.size, tuple(array.shape)))


def _record(stats: dict[str, ActivationPeaks], name: str,
            peaks: tuple[float, float, bool, tuple[int, ...]] | None) -> None:
    """Merge one run's (abs_max, max, nonfinite, shape) into the tensor's peaks so far."""
    if peaks is None:
        return
    abs_max, top, nonfinite, shape = peaks
    old = stats.get(name)
    if old is not None:
        abs_max, top, nonfinite = max(abs_max, old.abs_max), max(top, old.max), nonfinite or old.nonfinite
    stats[name] = ActivationPeaks(abs_max=abs_max, max=top, shape=shape, nonfinite=nonfinite)


def _session(model: onnx.ModelProto, extra: list[onnx.ValueInfoProto], path: Path, big: bool,
             edit: Callable[[onnx.GraphProto], object] | None = None) -> Any:
    """An ORT session of ``model`` with ``extra`` exposed as outputs (and ``edit``'s probes), read from a probe
    file."""

    # the weights streamed from the model itself: neither copied nor serialised whole (a big model's go to a
    # data file beside the probe: protobuf cannot hold more than 2 GB in one file)
    save_exposing(model, path, extra, external=big, edit=edit)
    return probe_session(path, in_order=True)  # each probe right after its tensor's producer (_peak_probes)


def probe_session(path: Path, *, in_order: bool = False) -> Any:
    """An ONNX Runtime session for analysis runs (a handful of samples, every tensor exposed): unoptimized, and
    holding no more memory than the model needs.

    ``in_order``: run the nodes in the model's order; ONNX Runtime's default order runs nodes without inputs to
    wait for (a weight's Cast) first, so their results would all be alive at once.
    """
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    # no prepacked copy of each weight beside the loaded one: a handful of runs does not pay for the memory
    options.add_session_config_entry("session.disable_prepacking", "1")
    options.enable_cpu_mem_arena = False  # the arena keeps its largest blocks (power-of-two sized) to the end
    # nor a memory pattern: from the second run on it allocates one block for every activation the plan holds,
    # beside what the run itself allocates (+0.55 GB on the emulation of a 135M-parameter decoder)
    options.enable_mem_pattern = False
    if in_order:
        options.execution_order = ort.ExecutionOrder.PRIORITY_BASED
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


class OverflowEntry(TypedDict):
    """A node kept in float32 because its real activations would overflow float16: the tensor and value that
    decided it (``findings.activation_blocked[]``)."""

    node: str
    op_type: str
    reason: str
    tensor: str
    abs_max: float
    predicted: float
    """The largest value float16 would have to hold there, by the rule of the op type (and the margin)."""


def overflowing_nodes(model: onnx.ModelProto, stats: dict[str, ActivationPeaks], max_finite: float, margin: float,
                      already_float32: set[str]) -> list[OverflowEntry]:
    """Main-graph nodes to keep in float32, each with the tensor and value that decided it, in graph order."""
    constants = _scalar_constants(model)
    kept: dict[str, OverflowEntry] = {}
    decided: set[str] = set()
    for chain in _attention_chains(model):
        decided.update(node.name for node in chain.nodes[1:])  # masks on the path are judged by the scores
        entry = _worst_of(chain.nodes[0], chain.scores, stats, 1.0 / margin**2, chain.reason)
        if entry is not None and entry["predicted"] > max_finite:
            for node in chain.nodes:
                kept.setdefault(node.name, {**entry, "node": node.name, "op_type": node.op_type})
    for node in model.graph.node:
        if node.name in kept or node.name in decided:
            continue
        entry = _node_entry(node, stats, margin, constants)
        if entry is not None and entry["predicted"] > max_finite:
            kept[node.name] = entry
    order = {node.name: index for index, node in enumerate(model.graph.node)}
    return [kept[name] for name in sorted(kept, key=order.__getitem__) if name not in already_float32]


def _node_entry(node: onnx.NodeProto, stats: dict[str, ActivationPeaks], margin: float,
                constants: dict[str, float]) -> OverflowEntry | None:
    """The worst predicted value of one node, by the rule of its op type."""
    entry = _worst([node], stats, 1.0 / margin, "activation range")
    special = None
    if node.op_type in ("Pow", "Mul") and len(node.input) > 1 and node.input[0] in stats:
        squares = node.op_type == "Mul" and node.input[0] == node.input[1]  # x * x is Pow(x, 2)
        exponent = 2.0 if squares else constants.get(node.input[1]) if node.op_type == "Pow" else None
        if exponent is not None and exponent > 1:
            base = stats[node.input[0]].abs_max
            rule = "square (x * x)" if squares else "Pow"
            special = _entry(node, node.input[0], base, _power(base / margin, exponent), rule)
    elif node.op_type == "Exp" and node.input[0] in stats:
        top = stats[node.input[0]].max
        special = _entry(node, node.input[0], top, _exp(max(top, 0.0) / margin), "Exp")
    elif node.op_type in ACCUMULATING_REDUCTIONS and node.input[0] in stats and node.output[0] in stats:
        special = _reduction_entry(node, stats[node.input[0]], stats[node.output[0]], margin)
    candidates = [e for e in (entry, special) if e is not None]
    return max(candidates, key=lambda e: e["predicted"]) if candidates else None


def _reduction_entry(node: onnx.NodeProto, source: ActivationPeaks, reduced: ActivationPeaks,
                     margin: float) -> OverflowEntry | None:
    count = max(1, math.prod(source.shape) // max(1, math.prod(reduced.shape)))
    if node.op_type == "ReduceMean":
        accumulated = reduced.abs_max * count
    elif node.op_type == "ReduceL2":
        accumulated = reduced.abs_max ** 2
    else:
        accumulated = _exp(max(reduced.max, 0.0))
    entry = _entry(node, node.output[0], reduced.abs_max, accumulated / margin, f"reduction over {count} elements")
    return entry


def _worst(nodes: list[onnx.NodeProto], stats: dict[str, ActivationPeaks], stretch: float,
           reason: str) -> OverflowEntry | None:
    names = [name for node in nodes for name in (*node.input, *node.output)]
    return _worst_of(nodes[0], names, stats, stretch, reason)


def _worst_of(node: onnx.NodeProto, names: list[str], stats: dict[str, ActivationPeaks], stretch: float,
              reason: str) -> OverflowEntry | None:
    seen = [(stats[name].abs_max, name) for name in names if name in stats]
    if not seen:
        return None
    value, tensor = max(seen)
    return _entry(node, tensor, value, value * stretch, reason)


def _entry(node: onnx.NodeProto, tensor: str, value: float, predicted: float, reason: str) -> OverflowEntry:
    # JSON has no inf: an overflowing prediction is reported as the largest float
    return {"node": node.name, "op_type": node.op_type, "reason": reason, "tensor": tensor,
            "abs_max": finite_or(value, sys.float_info.max), "predicted": finite_or(predicted, sys.float_info.max)}


def _power(base: float, exponent: float) -> float:
    try:
        return base ** exponent
    except OverflowError:
        return math.inf


def _exp(value: float) -> float:
    return math.exp(value) if value < 709 else math.inf


def _scalar_constants(model: onnx.ModelProto) -> dict[str, float]:
    """Single-valued float constants of the main graph (initializers and Constant nodes), e.g. Pow exponents."""
    from onnx import numpy_helper

    found: dict[str, float] = {}
    tensors = [(init.name, init) for init in model.graph.initializer]
    tensors += [(node.output[0], attr.t) for node in model.graph.node if node.op_type == "Constant"
                for attr in node.attribute if attr.name == "value"]
    for name, tensor in tensors:
        dims = list(tensor.dims)
        if all(dim == 1 for dim in dims):
            found[name] = float(numpy_helper.to_array(tensor).reshape(-1)[0])
    for node in model.graph.node:
        if node.op_type == "Constant":
            for attr in node.attribute:
                if attr.name == "value_float":
                    found[node.output[0]] = attr.f
    return found


@dataclass
class AttentionChain:
    """Score op -> scale/mask/reshape ops -> Softmax; `scores` are the tensors that grow quadratically."""

    nodes: list[onnx.NodeProto]
    scores: list[str]
    reason: str


def _attention_chains(model: onnx.ModelProto) -> list[AttentionChain]:
    """Every Softmax fed (through scale, mask and reshape ops) by a MatMul/Gemm/Einsum of activations."""
    producer = {out: node for node in model.graph.node for out in node.output}
    chains = []
    for node in model.graph.node:
        if node.op_type not in SOFTMAX_OPS:
            continue
        path = _path_to_scores(node, producer, depth=12)
        if path is None:
            continue
        nodes = list(reversed(path))
        scaled = any(step.op_type in SCALE_OPS for step in nodes)
        scores = [step.output[0] for step in nodes if step.op_type in SCORE_OPS or step.op_type in SCALE_OPS]
        reason = "attention scores" if scaled else "unnormalized attention scores"
        chains.append(AttentionChain(nodes=nodes, scores=scores, reason=reason))
    return chains


def _path_to_scores(node: onnx.NodeProto, producer: dict[str, onnx.NodeProto],
                    depth: int) -> list[onnx.NodeProto] | None:
    """[node, ..., score op] walking back through SCORE_PATH_OPS, or None."""
    if depth == 0:
        return None
    for name in node.input:
        upstream = producer.get(name)
        if upstream is None:
            continue
        if upstream.op_type in SCORE_OPS:
            return [node, upstream]
        if upstream.op_type in SCORE_PATH_OPS:
            rest = _path_to_scores(upstream, producer, depth - 1)
            if rest is not None:
                return [node, *rest]
    return None
