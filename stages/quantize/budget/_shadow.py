"""The int8 budget's ranking signal: the error each quantized node adds by itself.

One run of the fully quantized model into which a float copy of every candidate node is added, reading what the
quantized node's inputs were before quantization (the same upstream values) and the float weights.  The
noise-to-signal ratio between the node's output and its copy's is the error the node adds itself, whatever
arrives from upstream: one run for every node (``qdeploy.stages.accuracy_budget.rank`` ranks by it).

Edits protobuf directly: the models it builds are ORT quantizer outputs, built in linear time.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from qdeploy.graph.external_data import needs_external_data
from qdeploy.graph.names import node_names
from qdeploy.graph.utils import fresh_name
from qdeploy.stages.accuracy_budget.evaluate import Feeds, ort_session

if TYPE_CHECKING:
    import onnx

    from qdeploy.stages.accuracy_budget.search import Signal


def local_errors(float_model: onnx.ModelProto, quantized: onnx.ModelProto, candidates: dict[str, str],
                 feeds: list[Feeds], work_dir: Path) -> dict[str, float]:
    """Per candidate: the noise-to-signal ratio of its outputs against its float copy's (see the module doc)."""
    probe, pairs = _shadowed(float_model, quantized, candidates)
    path = work_dir / "budget_rank_probe.onnx"
    import onnx

    onnx.save(probe, str(path), save_as_external_data=needs_external_data(probe))
    session = ort_session(str(path))
    names = [name for pair in pairs.values() for name in pair]
    signal = dict.fromkeys(pairs, 0.0)
    noise = dict.fromkeys(pairs, 0.0)
    for feed in feeds:
        values = dict(zip(names, session.run(names, feed), strict=True)) if names else {}
        for output, (quantized_name, shadow_name) in pairs.items():
            got, expected = np.asarray(values[quantized_name]), np.asarray(values[shadow_name])
            if expected.dtype.kind != "f" or expected.shape != got.shape:
                continue
            expected, got = expected.astype(np.float64), got.astype(np.float64)
            finite = np.isfinite(expected) & np.isfinite(got)
            signal[output] += float(np.sum(expected[finite] ** 2))
            noise[output] += float(np.sum((got[finite] - expected[finite]) ** 2))
    ratio = {output: noise[output] / signal[output] if signal[output] > 0 else (0.0 if noise[output] == 0 else math.inf)
             for output in pairs}
    outputs_of = {node.name: [o for o in node.output if o in ratio] for node in float_model.graph.node}
    return {name: max((ratio[o] for o in outputs_of.get(name, [])), default=0.0) for name in candidates}


def _shadowed(float_model: onnx.ModelProto, quantized: onnx.ModelProto,
              candidates: dict[str, str]) -> tuple[onnx.ModelProto, dict[str, tuple[str, str]]]:
    """The quantized model plus, per candidate, a float copy of its node (from the float model) that reads what
    the quantized node's inputs were before quantization and the float weights; outputs exposed in pairs
    (quantized tensor, float copy's tensor) keyed by the float model's output name."""
    import onnx

    probe = onnx.ModelProto()
    probe.CopyFrom(quantized)
    graph = probe.graph
    available = {name for node in graph.node for name in node.output} | {value.name for value in graph.input}
    present = {init.name: init for init in graph.initializer}
    float_inits = {init.name: init for init in float_model.graph.initializer}
    taken = available | set(present) | node_names(graph)
    pairs: dict[str, tuple[str, str]] = {}
    for node in float_model.graph.node:
        if node.name not in candidates or not set(node.output) & available:
            continue
        inputs = [_shadow_input(name, available, present, float_inits, graph, taken) for name in node.input]
        if None in inputs:
            continue
        shadow = onnx.NodeProto()
        shadow.CopyFrom(node)
        shadow.name = fresh_name(f"{node.name}__float_shadow", taken)
        del shadow.input[:]
        shadow.input.extend(inputs)  # type: ignore[arg-type]
        for index, output in enumerate(node.output):
            shadow.output[index] = fresh_name(f"{output}__float_shadow", taken) if output else ""
            if output in available:
                pairs[output] = (output, shadow.output[index])
        graph.node.append(shadow)
    exposed = {value.name for value in graph.output}
    graph.output.extend(onnx.ValueInfoProto(name=name) for pair in pairs.values() for name in pair
                        if name not in exposed)
    return probe, pairs


def _shadow_input(name: str, available: set[str], present: dict[str, onnx.TensorProto],
                  float_inits: dict[str, onnx.TensorProto], graph: onnx.GraphProto, taken: set[str]) -> str | None:
    """The tensor a float copy reads for an input of the float node: the same activation of the quantized model,
    or the float weight (added under a new name when the quantized model holds something else under its name)."""
    if not name or (name in available and name not in float_inits):
        return name
    weight = float_inits.get(name)
    if weight is None:
        return None
    same = present.get(name)
    if same is not None and same.data_type == weight.data_type and list(same.dims) == list(weight.dims):
        return name
    copied = graph.initializer.add()
    copied.CopyFrom(weight)
    copied.name = fresh_name(f"{name}__float_shadow", taken)
    present[copied.name] = copied
    float_inits[copied.name] = copied
    return copied.name


def shadow_signal(float_model: Path, work_dir: Path) -> Signal:
    """The engine's ranking signal for int8 (``qdeploy.stages.accuracy_budget.search.Signal``): ``local_errors``
    against the float model at ``float_model``."""
    def signal(quantized: onnx.ModelProto, candidates: dict[str, str], feeds: list[Feeds]) -> dict[str, float]:
        import onnx

        return local_errors(onnx.load(str(float_model)), quantized, candidates, feeds, work_dir)

    return signal
