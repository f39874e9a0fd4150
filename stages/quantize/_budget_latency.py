"""Latency-aware reverting (``budget.weigh_latency``): among kept-float sets that hold the tolerance, the one
whose float nodes cost least time on the target.

The search's ranking puts the most harmful node first, whatever keeping it float costs: a large convolution
kept float can cost more than the int8 gains everywhere else.  Here every candidate also has a cost, the
seconds it adds per inference when kept float on a target, from a ``TimingSource``:

- ``OrtNodeTiming`` (ort:cpu): ONNX Runtime's per-node profile of the float model (each node's kernel
  time), times ``1 - 1/s`` where ``s`` is the whole-model int8 speed-up measured on the same session
  options.  A model of the per-node cost calibrated by one measurement of each whole model, not a per-node
  measurement of the int8 graph (ORT fuses QDQ nodes into kernels named differently).
- ``OpenVinoLayerTiming`` (openvino:cpu): OpenVINO's per-layer performance counters of the float model
  (``PERF_COUNT``), scaled the same way.
- tests inject their own (a dict of seconds).

The search then runs a second time with the candidates ordered by harm per second (the ranking's measured
damage, else its local error, over the cost): cheap nodes that buy as much accuracy come first.  Each search
gives one point (kept set, its metric, its added seconds per target); with the fully quantized model they form
the front recorded in ``findings.budget.front``, and the fastest point that holds the tolerance (search and
held-back samples) is the one written.  The cost: one more search (``O(log n)`` evaluations) and one profile
per timing source.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from qdeploy.graph.external_data import needs_external_data

if TYPE_CHECKING:
    import onnx

    from qdeploy.stages.quantize._budget_eval import Feeds
    from qdeploy.stages.quantize._budget_rank import Ranked

PROFILE_RUNS = 3
"""Runs per profiled session (the first warms up and is not counted)."""


class TimingSource(Protocol):
    """Seconds each candidate adds per inference on one target when kept float."""

    target: str
    how: str
    """'measured: ...' or 'model: ...': what the numbers are."""

    def float_costs(self, float_model: Path, quantized: onnx.ModelProto, candidates: Sequence[str],
                    feeds: list[Feeds]) -> dict[str, float]: ...


@dataclass
class FixedTiming:
    """Given costs (tests, or costs measured elsewhere)."""

    costs: dict[str, float]
    target: str = "ort:cpu"
    how: str = "given"

    def float_costs(self, float_model: Path, quantized: onnx.ModelProto, candidates: Sequence[str],
                    feeds: list[Feeds]) -> dict[str, float]:
        return {name: float(self.costs.get(name, 0.0)) for name in candidates}


class OrtNodeTiming:
    """ONNX Runtime CPU: per-node kernel times of the float model, scaled by the measured int8 speed-up."""

    target = "ort:cpu"
    how = ("model calibrated by measurement: ONNX Runtime's per-node profile of the float model times "
           "(1 - 1/speed-up), the speed-up measured on the whole float and int8 models")

    def float_costs(self, float_model: Path, quantized: onnx.ModelProto, candidates: Sequence[str],
                    feeds: list[Feeds]) -> dict[str, float]:
        per_node, float_total = _ort_profile(float_model, feeds)
        int8_path = float_model.with_name("budget_latency_int8.onnx")
        _save(quantized, int8_path)
        _, int8_total = _ort_profile(int8_path, feeds)
        return _scaled(per_node, float_total, int8_total, candidates, float_model)


class OpenVinoLayerTiming:
    """OpenVINO CPU: per-layer performance counters of the float model (f32), scaled by the measured speed-up."""

    target = "openvino:cpu"
    how = ("model calibrated by measurement: OpenVINO's per-layer performance counters of the float model (f32) "
           "times (1 - 1/speed-up), the speed-up measured on the whole float and int8 models")

    def float_costs(self, float_model: Path, quantized: onnx.ModelProto, candidates: Sequence[str],
                    feeds: list[Feeds]) -> dict[str, float]:
        per_node, float_total = _openvino_profile(float_model, feeds, _owners(float_model, candidates))
        int8_path = float_model.with_name("budget_latency_int8.onnx")
        _save(quantized, int8_path)
        _, int8_total = _openvino_profile(int8_path, feeds, lambda names: names)
        return _scaled(per_node, float_total, int8_total, candidates, float_model)


def timing_sources(targets: Sequence[str]) -> list[TimingSource]:
    """The timing sources of the targets that have one, in the recipe's order (ort:cpu first when none)."""
    known: dict[str, TimingSource] = {"ort:cpu": OrtNodeTiming(), "openvino:cpu": OpenVinoLayerTiming()}
    chosen = [known[name] for name in targets if name in known]
    return chosen or [known["ort:cpu"]]


def measure_costs(timing: Sequence[TimingSource], float_model: Path, quantized: onnx.ModelProto,
                  candidates: Sequence[str], feeds: list[Feeds]) -> tuple[dict[str, dict[str, float]], dict[str, str]]:
    """(target -> candidate -> seconds, for the sources that could time the model; target -> what the numbers are,
    or why that source could not time it)."""
    costs, how = {}, {}
    for source in timing:
        try:
            costs[source.target] = source.float_costs(float_model, quantized, candidates, feeds)
            how[source.target] = source.how
        except Exception as exc:  # a runtime that cannot profile the model: no latency point there, not a crash
            how[source.target] = f"could not time the model: {type(exc).__name__}: {str(exc)[:200]}"
    return costs, how


def by_harm_per_second(ranked: list[Ranked], costs: dict[str, float]) -> list[str]:
    """Candidates ordered by the harm they remove per second they cost kept float (most first)."""
    positive = [value for value in costs.values() if value > 0]
    floor = min(positive) * 1e-3 if positive else 1e-9
    order = {item.name: index for index, item in enumerate(ranked)}

    def harm(item: Ranked) -> float:
        return max(item.alone, 0.0) if item.alone is not None and item.alone > 0 else max(item.local, 0.0)

    return [item.name for item in sorted(ranked, key=lambda item: (-harm(item) / max(costs.get(item.name, 0.0),
                                                                                        floor), order[item.name]))]


@dataclass
class Point:
    """One model of the front: the nodes kept float, how it was found, whether it holds, its added seconds."""

    kept: list[str]
    found_by: str
    holds: bool
    comparison: dict[str, Any]
    added_seconds: dict[str, float]

    def finding(self) -> dict[str, Any]:
        return {"found_by": self.found_by, "kept_float": sorted(self.kept), "holds": self.holds,
                "task_or_error": self.comparison,
                "added_seconds_per_inference": {target: float(f"{value:.4g}")
                                                for target, value in self.added_seconds.items()},
                "recipe": {"exclude_nodes": sorted(self.kept)}}


def added_seconds(kept: Sequence[str], costs: dict[str, dict[str, float]]) -> dict[str, float]:
    return {target: sum(per_node.get(name, 0.0) for name in kept) for target, per_node in costs.items()}


def fastest(points: list[Point], primary: str) -> int:
    """The index of the point that holds with the fewest added seconds on ``primary``; -1 when none holds."""
    holding = [index for index, point in enumerate(points) if point.holds]
    if not holding:
        return -1
    return min(holding, key=lambda index: (points[index].added_seconds.get(primary, 0.0), len(points[index].kept)))


def _scaled(per_node: dict[str, float], float_total: float, int8_total: float, candidates: Sequence[str],
            float_model: Path) -> dict[str, float]:
    """Per candidate: its float kernel time times (1 - 1/speed-up): what it saves when int8, so what it costs
    kept float.  A speed-up at or below 1 still orders by float time (a small floor)."""
    speedup = float_total / int8_total if int8_total > 0 else 1.0
    share = max(1.0 - 1.0 / speedup, 0.05) if speedup > 0 else 0.05
    outputs = _outputs_of(float_model, candidates)
    return {name: _time_of([name, *outputs.get(name, [])], per_node) * share for name in candidates}


def _time_of(keys: list[str], per_node: dict[str, float]) -> float:
    """A node's time: the entries named after it or its outputs, and the kernels a runtime derived from them
    (OpenVINO names a Gemm's MatMul 'node/WithoutBiases', ONNX Runtime a blocked-layout Conv 'output_nchwc')."""
    return sum(seconds for name, seconds in per_node.items()
               if any(name == key or name.startswith((f"{key}/", f"{key}_")) for key in keys))


def _outputs_of(path: Path, candidates: Sequence[str]) -> dict[str, list[str]]:
    import onnx

    wanted = set(candidates)
    graph = onnx.load(str(path), load_external_data=False).graph
    return {node.name: [name for name in node.output if name] for node in graph.node if node.name in wanted}


def _ort_profile(path: Path, feeds: list[Feeds]) -> tuple[dict[str, float], float]:
    """Seconds per node name (mean per run) from ONNX Runtime's profile, and the mean wall time per run."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.enable_profiling = True
    options.profile_file_prefix = str(path.with_suffix(""))
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    runs = [feeds[index % len(feeds)] for index in range(PROFILE_RUNS)]
    session.run(None, runs[0])
    started = time.perf_counter()
    for feed in runs[1:]:
        session.run(None, feed)
    wall = (time.perf_counter() - started) / max(len(runs) - 1, 1)
    profile = Path(session.end_profiling())
    events = json.loads(profile.read_text())
    profile.unlink(missing_ok=True)
    per_node: dict[str, float] = {}
    for event in events:
        name = str(event.get("name", ""))
        if event.get("cat") == "Node" and name.endswith("_kernel_time"):
            node = name[: -len("_kernel_time")]
            per_node[node] = per_node.get(node, 0.0) + float(event.get("dur", 0)) * 1e-6
    return {node: seconds / len(runs) for node, seconds in per_node.items()}, wall


def _owners(float_model: Path, candidates: Sequence[str]) -> Callable[[list[str]], list[str]]:
    """Which candidates a fused OpenVINO layer's time belongs to, from the model's layers it was made of: those
    that are candidates ('node/WithoutBiases' counts for 'node'), else the candidates that feed them (OpenVINO
    renames a Conv folded with its scale 'Multiply_123', listing only what followed it)."""
    import onnx

    wanted = set(candidates)
    graph = onnx.load(str(float_model), load_external_data=False).graph
    producer = {output: node.name for node in graph.node for output in node.output if output}
    inputs = {node.name: list(node.input) for node in graph.node}

    def owners(names: list[str]) -> list[str]:
        own = sorted({name.split("/")[0] for name in names} & wanted)
        if own:
            return own
        return sorted({producer[tensor] for name in names for tensor in inputs.get(name, [])
                       if producer.get(tensor) in wanted})

    return owners


def _openvino_profile(path: Path, feeds: list[Feeds],
                      owners: Callable[[list[str]], list[str]]) -> tuple[dict[str, float], float]:
    """Seconds per owner (``owners`` of each layer's original names) from OpenVINO's performance counters (last
    run), and the mean wall time per run."""
    import openvino as ov

    core = ov.Core()
    compiled = core.compile_model(str(path), "CPU", {"PERF_COUNT": "YES", "INFERENCE_PRECISION_HINT": "f32"})
    request = compiled.create_infer_request()
    runs = [feeds[index % len(feeds)] for index in range(PROFILE_RUNS)]
    request.infer({name: np.asarray(value) for name, value in runs[0].items()})
    started = time.perf_counter()
    for feed in runs[1:]:
        request.infer({name: np.asarray(value) for name, value in feed.items()})
    wall = (time.perf_counter() - started) / max(len(runs) - 1, 1)
    per_node: dict[str, float] = {}
    # a fused layer lists the model's layers it was made of (rt_info originalLayersNames): its time is shared
    # among them
    origins = {op.get_friendly_name(): _original_names(op) for op in compiled.get_runtime_model().get_ops()}
    for info in request.get_profiling_info():
        seconds = info.real_time.total_seconds() if hasattr(info.real_time, "total_seconds") else 0.0
        names = owners(origins.get(info.node_name) or [info.node_name]) or [info.node_name]
        for name in names:
            per_node[name] = per_node.get(name, 0.0) + seconds / len(names)
    return per_node, wall


def _original_names(op: Any) -> list[str]:
    info = op.get_rt_info()
    if "originalLayersNames" not in info:
        return []
    value = info["originalLayersNames"]
    text = value.astype(str) if hasattr(value, "astype") else str(value)
    return [name for name in text.split(",") if name]


def _save(model: onnx.ModelProto, path: Path) -> None:
    import onnx

    onnx.save(model, str(path), save_as_external_data=needs_external_data(model))
