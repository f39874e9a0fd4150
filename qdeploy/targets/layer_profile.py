"""Where the time goes, layer by layer: the one per-layer profiler of each runtime, each executed kernel or layer
mapped back to the ONNX nodes it computes.  Used by the report's per-layer pass
(``qdeploy.pipeline.results.layers``) and by the int8 budget's latency-aware reverting
(``qdeploy.stages.accuracy_budget.latency``), always on a session created for it, apart from any timed benchmark.

ONNX Runtime: the session profile (``SessionOptions.enable_profiling``): each kernel's op, provider, input types and
time.  A kernel is mapped to the ONNX node it is named after (ORT appends ``_token_N``, ``_nchwc``... to the nodes
it rewrites); a kernel named after no node (a layout ``Transpose`` or ``ReorderOutput`` ORT inserted) is a gap.
OpenVINO: the performance counters (``ov.properties.enable_profiling``): each executed layer's type, exec type
(``brgconv_avx512_I8``, ``jit_avx512_f32``) and real time; the runtime model's ``originalLayersNames`` names the
original layers each executed layer fused, which map back to ONNX nodes by name (OpenVINO's ONNX frontend names
an op after its node, ``node/suffix`` for the ops a node expands into, or after its output tensor).  A layer
that fused several ONNX nodes is one row with the group; layers OpenVINO created itself map to no node.  When a
runtime names a fused layer without its compute node (OpenVINO renames a Conv folded with a BatchNormalization or
a scale), ``complete_groups`` adds it from the graph.
"""

from __future__ import annotations

import bisect
import json
import logging
import re
import shutil
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

import numpy as np

from qdeploy.core.onnx_wire import load_model
from qdeploy.targets import get_target
from qdeploy.targets.base import INT8_ORT_OPS
from qdeploy.targets.openvino_read import read_onnx

if TYPE_CHECKING:
    from qdeploy.targets.onnxruntime import OrtProfileEvent

__all__ = ["LayerTime", "LayerTimeDict", "NodeIndex", "Profile", "complete_groups", "exec_precision", "map_ov_names",
           "ort_kernel_precision", "ort_node_of", "profile_layers"]

log = logging.getLogger(__name__)

QDQ_OPS = frozenset({"QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear"})
# ORT's graph transformers name what they make after a node: "_token_N", "_nchwc", ..., "node/QuickGeluFusion/"
_ORT_SUFFIX = re.compile(
    r"(_token_\d+|_nchwc|_quant|_Fused\w*|_fused\w*|_output_\d+|/\w*Fusion/)$|^(InsertedPrecisionFreeCast_)")
_TYPE_PRECISION = {"float": "f32", "float16": "f16", "bfloat16": "bf16", "int8": "int8", "uint8": "int8",
                   "double": "f64"}
_WARMUP = 1


class LayerTimeDict(TypedDict):
    """``LayerTime.to_dict()``."""

    layer: str
    op: str
    exec: str
    precision: str
    time_ms: float
    nodes: list[str]
    through_graph: list[str]


@dataclass
class LayerTime:
    """One executed kernel or layer: what ran, in which precision, for how long, and which ONNX nodes it holds."""

    layer: str
    op: str
    exec: str
    precision: str
    time_ms: float
    nodes: list[str] = field(default_factory=list)
    """ONNX nodes this layer computes; empty: a gap (the runtime added it, or named it after nothing known)."""
    through_graph: list[str] = field(default_factory=list)
    """Nodes of ``nodes`` the runtime did not name: the producer chain the layer's op type needs (a Conv that
    ORT fused with its BatchNormalization and Relu under the Relu's name)."""

    def to_dict(self) -> LayerTimeDict:
        return LayerTimeDict(**asdict(self))


@dataclass
class Profile:
    """A profiled session's layers in execution order, and how long the profiled inferences took."""

    layers: list[LayerTime]
    runs: int
    profiled_ms: float
    """Median wall time of one profiled inference (the profiler's own cost included)."""
    notes: list[str] = field(default_factory=list)
    outputs: list[dict[str, np.ndarray]] = field(default_factory=list)
    """The model's outputs on each of ``also_run`` (the shipped graph's, from the same compiled model)."""


def profile_layers(model_path: Path, target: str, feeds: dict[str, np.ndarray], *, runs: int = 5,
                   pin_f32: bool = True, precision: str | None = None,
                   also_run: list[dict[str, np.ndarray]] | None = None) -> Profile:
    """Profile ``runs`` inferences of the model on ``target`` (one warm-up first); per-layer median times.
    ``also_run``: feeds whose outputs the profile keeps (after the timed runs; saves compiling the model again)."""
    runtime = target.split(":", 1)[0]
    graph = NodeIndex.of(model_path)
    also_run = also_run or []
    if runtime == "ort":
        profile = _profile_ort(model_path, target, feeds, runs, pin_f32, graph.names, also_run)
    elif runtime == "openvino":
        profile = _profile_openvino(model_path, target, feeds, runs, pin_f32, precision, graph.names, also_run)
    else:
        return Profile([], 0, 0.0, [f"{target}: no per-layer profiler for this runtime"])
    complete_groups(profile.layers, graph)
    return profile


@dataclass
class NodeIndex:
    """The ONNX graph as the mapping needs it: names (node names and output tensors) -> node, op types, producers."""

    names: dict[str, str]
    op_types: dict[str, str]
    producer_of: dict[str, list[str]]
    """node -> the nodes producing its inputs (weights excluded)."""
    consumers: dict[str, int]
    """node -> how many nodes read its outputs."""

    @classmethod
    def of(cls, model_path: Path) -> NodeIndex:
        model = load_model(model_path, load_external_data=False)
        names: dict[str, str] = {}
        op_types: dict[str, str] = {}
        made_by: dict[str, str] = {}
        for index, node in enumerate(model.graph.node):  # node names first: they win over a same-named tensor
            name = node.name or f"{node.op_type}_{index}"
            names[name] = name
            op_types[name] = node.op_type
        for index, node in enumerate(model.graph.node):
            for out in node.output:
                if out:
                    names.setdefault(out, node.name or f"{node.op_type}_{index}")
                    if node.op_type != "Constant":  # a Constant node is a weight (exported graphs hold them so)
                        made_by[out] = node.name or f"{node.op_type}_{index}"
        producer_of: dict[str, list[str]] = {}
        consumers: dict[str, int] = {}
        for index, node in enumerate(model.graph.node):
            name = node.name or f"{node.op_type}_{index}"
            producer_of[name] = [made_by[i] for i in node.input if i in made_by]
            for parent in set(producer_of[name]):
                consumers[parent] = consumers.get(parent, 0) + 1
        return cls(names, op_types, producer_of, consumers)


_LAYER_OPS = {"Conv": ("Conv", "ConvInteger"), "Convolution": ("Conv", "ConvInteger"),
              "GroupConvolution": ("Conv",), "QLinearConv": ("Conv",), "FullyConnected": ("MatMul", "Gemm"),
              "FullyConnectedQuantizedLegacy": ("MatMul", "Gemm"), "MatMul": ("MatMul", "Gemm"),
              "Gemm": ("Gemm", "MatMul"), "QGemm": ("Gemm", "MatMul"), "QLinearMatMul": ("MatMul",)}
"""A layer's op type -> the ONNX op types that must be in its group (a Convolution layer computes a Conv)."""


def complete_groups(layers: list[LayerTime], graph: NodeIndex) -> None:
    """Add the compute node a layer's name left out: walk back from its earliest node through single-consumer
    producers (at most 3 steps) to a node of the op type the layer computes that no other layer claims."""
    claimed = {node for layer in layers for node in layer.nodes}
    for layer in layers:
        _add_sandwiched(layer, graph, claimed)
        wanted = _LAYER_OPS.get(layer.op)
        if not wanted or not layer.nodes or any(graph.op_types.get(n) in wanted for n in layer.nodes):
            continue
        chain, current = [], layer.nodes[0]
        for _ in range(3):
            parents = graph.producer_of.get(current, [])
            if len(parents) != 1 or graph.consumers.get(parents[0], 0) != 1 or parents[0] in claimed:
                break
            current = parents[0]
            chain.append(current)
            if graph.op_types.get(current) in wanted:
                layer.through_graph = chain[::-1]
                layer.nodes = [*chain[::-1], *layer.nodes]
                claimed.update(chain)
                break


def ort_node_of(kernel: str, names: dict[str, str]) -> str | None:
    """The ONNX node an ORT kernel is named after (ORT's suffixes stripped), or None (a gap)."""
    current = kernel
    for _ in range(4):
        if current in names and not current.startswith("#"):
            return names[current]
        stripped = _ORT_SUFFIX.sub("", current)
        if stripped == current:
            return None
        current = stripped
    return None


def ort_kernel_precision(op: str, input_types: list[str]) -> str:
    """int8 for ORT's integer kernels, 'q/dq' for (de)quantization, else the element type of the first input."""
    if op in INT8_ORT_OPS:
        return "int8"
    if op in QDQ_OPS:
        return "q/dq"
    return _TYPE_PRECISION.get(input_types[0], input_types[0]) if input_types else "?"


def _profile_ort(model_path: Path, target: str, feeds: dict[str, np.ndarray], runs: int, pin_f32: bool,
                 names: dict[str, str], also_run: list[dict[str, np.ndarray]]) -> Profile:
    import onnxruntime as ort

    adapter = get_target(target)
    folder = tempfile.mkdtemp(prefix="qdeploy-layers-")
    try:
        options = ort.SessionOptions()
        options.log_severity_level = 3
        options.enable_profiling = True
        options.profile_file_prefix = str(Path(folder) / "layers")
        provider_options, _ = adapter._provider_options(pin_f32)  # the same options the target loads with
        session = ort.InferenceSession(str(model_path), sess_options=options, providers=adapter.providers,
                                       provider_options=provider_options)
        walls = _timed_runs(lambda: session.run(None, feeds), runs)
        events = json.loads(Path(session.end_profiling()).read_text())
        output_names = [value.name for value in session.get_outputs()]
        outputs = [dict(zip(output_names, session.run(None, feed), strict=True)) for feed in also_run]
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return Profile(_ort_layers(events, names, runs), runs, statistics.median(walls), outputs=outputs)


def _timed_runs(call: Any, runs: int) -> list[float]:
    walls = []
    for index in range(_WARMUP + runs):
        started = time.perf_counter()
        call()
        if index >= _WARMUP:
            walls.append((time.perf_counter() - started) * 1e3)
    return walls


def _ort_layers(events: list[OrtProfileEvent], names: dict[str, str], runs: int) -> list[LayerTime]:
    """Kernels in first-run order, each with the median over the timed runs (the warm-up dropped) of its time per
    run: a run the OS preempted moves a mean, not a median."""
    starts = sorted(event["ts"] for event in events if event.get("name") == "model_run")
    layers: dict[str, LayerTime] = {}
    per_run: dict[str, dict[int, float]] = {}
    for event in events:
        name = str(event.get("name", ""))
        if event.get("cat") != "Node" or not name.endswith("_kernel_time"):
            continue
        kernel = name.removesuffix("_kernel_time")
        args = event.get("args", {})
        if kernel not in layers:
            op = str(args.get("op_name", "?"))
            types = [next(iter(item)) for item in args.get("input_type_shape") or [] if isinstance(item, dict) and item]
            node = ort_node_of(kernel, names)
            layers[kernel] = LayerTime(kernel, op, str(args.get("provider", "?")), ort_kernel_precision(op, types),
                                       0.0, [node] if node else [])
        run = bisect.bisect_right(starts, event.get("ts", 0)) - 1
        if run >= _WARMUP:
            times = per_run.setdefault(kernel, {})
            times[run] = times.get(run, 0.0) + float(event.get("dur", 0)) / 1e3
    for kernel, layer in layers.items():
        timed = per_run.get(kernel, {})
        layer.time_ms = statistics.median([timed.get(run, 0.0) for run in range(_WARMUP, _WARMUP + runs)])
    return list(layers.values())


def _add_sandwiched(layer: LayerTime, graph: NodeIndex, claimed: set[str]) -> None:
    """A node fed only by the layer's nodes and feeding one of them ran inside the layer (a Relu between a
    Convolution and its QuantizeLinear that OpenVINO fused without naming it)."""
    for _ in range(2):
        inside = set(layer.nodes)
        between = [p for n in layer.nodes for p in graph.producer_of.get(n, []) if p not in inside and p not in claimed
                   and graph.producer_of.get(p) and set(graph.producer_of[p]) <= inside]
        for node in dict.fromkeys(between):
            layer.through_graph.append(node)
            position = min(i for i, n in enumerate(layer.nodes) if node in graph.producer_of.get(n, []))
            layer.nodes.insert(position, node)
            claimed.add(node)


def exec_precision(exec_type: str) -> str:
    """The precision an OpenVINO exec type names (``brgconv_avx512_I8`` -> int8, ``jit_avx512_bf16`` -> bf16)."""
    tail = exec_type.rsplit("_", 1)[-1].lower()
    return {"i8": "int8", "u8": "int8", "bf16": "bf16", "f16": "f16", "f32": "f32", "fp32": "f32",
            "i32": "int32", "i64": "int64"}.get(tail, "?")


def map_ov_names(original: list[str], names: dict[str, str]) -> list[str]:
    """ONNX nodes behind OpenVINO's original layer names: by node name, ``node/...`` prefix or output tensor."""
    nodes = []
    for name in original:
        for candidate in (name, name.split("/", 1)[0]):
            if candidate in names and not candidate.startswith("#"):
                nodes.append(names[candidate])
                break
    return list(dict.fromkeys(nodes))


def _profile_openvino(model_path: Path, target: str, feeds: dict[str, np.ndarray], runs: int, pin_f32: bool,
                      precision: str | None, names: dict[str, str], also_run: list[dict[str, np.ndarray]]) -> Profile:
    import openvino as ov

    core = ov.Core()
    config: dict[Any, Any] = {ov.properties.enable_profiling(): True}
    hint = precision or ("f32" if pin_f32 else None)
    if hint:
        config["INFERENCE_PRECISION_HINT"] = hint
    model, read_notes = read_onnx(core, model_path)
    compiled = core.compile_model(model, target.split(":", 1)[1].upper(), config)
    request = compiled.create_infer_request()
    inputs = _ov_inputs(compiled, feeds)
    per_run: list[dict[str, tuple[str, str, float]]] = []

    def once() -> None:
        request.infer(inputs)
        per_run.append({info.node_name: (info.node_type, info.exec_type, info.real_time.total_seconds() * 1e3)
                        for info in request.get_profiling_info() if str(info.status).endswith("EXECUTED")})

    walls = _timed_runs(once, runs)
    fused = _original_layers(compiled)
    timed = per_run[_WARMUP:]
    layers = []
    for name, (node_type, exec_type, _) in timed[0].items() if timed else []:
        median = statistics.median(run[name][2] for run in timed if name in run)
        layers.append(LayerTime(name, node_type, exec_type, exec_precision(exec_type), median,
                                map_ov_names(fused.get(name, []), names)))
    outputs = []
    for feed in also_run:
        results = request.infer(_ov_inputs(compiled, feed), share_outputs=False)
        outputs.append({name: np.array(results[port], copy=True) for port in compiled.outputs
                        for name in port.get_names() if name in names})
    return Profile(layers, runs, statistics.median(walls), notes=read_notes, outputs=outputs)


def _ov_inputs(compiled: Any, feeds: dict[str, np.ndarray]) -> dict[Any, np.ndarray]:
    return {port: np.asarray(feeds[name]) for port in compiled.inputs for name in port.get_names() if name in feeds}


def _original_layers(compiled: Any) -> dict[str, list[str]]:
    """Executed layer -> the original layers it fused (the runtime model's ``originalLayersNames``)."""
    found = {}
    for op in compiled.get_runtime_model().get_ordered_ops():
        info = op.get_rt_info()
        if "originalLayersNames" in info:
            found[op.get_friendly_name()] = [n for n in info["originalLayersNames"].astype(str).split(",") if n]
    return found
