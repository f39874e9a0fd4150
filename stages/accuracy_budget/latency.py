"""Latency-aware reverting (``budget.weigh_latency``): among kept-float sets that hold the tolerance, the one
whose float nodes cost least time on the target.

The search's ranking puts the most harmful node first, whatever keeping it float costs: a large convolution
kept float can cost more than the int8 gains everywhere else.  Here every candidate also has a cost, the
seconds it adds per inference when kept float on a target, from a ``TimingSource``:

- ``OrtNodeTiming`` (ort:cpu) and ``OpenVinoLayerTiming`` (openvino:cpu): the runtime's per-layer profile of
  the float model (``qdeploy.targets.layer_profile``: ONNX Runtime's kernel times, OpenVINO's performance
  counters, each layer mapped back to the ONNX nodes it computes, a Conv OpenVINO renamed when folding it
  included), times ``1 - 1/s`` where ``s`` is the whole-model int8 speed-up measured on the same session
  options.  A candidate's float time is that of the profiled layers that hold it; a fused layer that holds
  several candidates is split equally among them.  A model of the per-node cost calibrated by one measurement
  of each whole model, not a per-node measurement of the int8 graph (the runtimes fuse QDQ nodes into kernels
  named differently).
- tests inject their own (a dict of seconds).

The search then runs a second time with the candidates ordered by harm per second (the ranking's measured
damage, else its local error, over the cost): cheap nodes that buy as much accuracy come first.  Each search
gives one point (kept set, its metric, its added seconds per target); with the fully quantized model they form
the front recorded in ``findings.budget.front``, and the fastest point that holds the tolerance (search and
held-back samples) is the one written.  The cost: one more search (``O(log n)`` evaluations) and one profile
per timing source.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from qdeploy.graph.external_data import needs_external_data
from qdeploy.stages.accuracy_budget.findings import BudgetComparison, FrontPointRecord
from qdeploy.targets.layer_profile import LayerTime, profile_layers

if TYPE_CHECKING:
    import onnx

    from qdeploy.stages.accuracy_budget.evaluate import Feeds
    from qdeploy.stages.accuracy_budget.rank import Ranked

__all__ = ["FixedTiming", "OpenVinoLayerTiming", "OrtNodeTiming", "Point", "TimingSource", "added_seconds",
           "by_harm_per_second", "fastest", "measure_costs", "timing_sources"]

PROFILE_RUNS = 3
"""Runs per profiled session (the first warms up and is not counted; the rest give medians)."""


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


class _ProfiledTiming:
    """A runtime's per-layer profile of the float model, scaled by the measured whole-model int8 speed-up."""

    target = ""
    how = ""

    def float_costs(self, float_model: Path, quantized: onnx.ModelProto, candidates: Sequence[str],
                    feeds: list[Feeds]) -> dict[str, float]:
        float_profile = profile_layers(float_model, self.target, feeds[0], runs=PROFILE_RUNS - 1)
        int8_path = float_model.with_name("budget_latency_int8.onnx")
        _save(quantized, int8_path)
        int8_profile = profile_layers(int8_path, self.target, feeds[0], runs=PROFILE_RUNS - 1)
        return _scaled(_per_candidate(float_profile.layers, candidates), float_profile.profiled_ms,
                       int8_profile.profiled_ms, candidates)


_SPLIT = ("; a candidate's time is that of the profiled layers that hold it (qdeploy.targets.layer_profile maps "
          "them to ONNX nodes), a fused layer holding several candidates split equally among them")


class OrtNodeTiming(_ProfiledTiming):
    """ONNX Runtime CPU: per-kernel times of the float model, scaled by the measured int8 speed-up."""

    target = "ort:cpu"
    how = ("model calibrated by measurement: ONNX Runtime's per-node profile of the float model times "
           "(1 - 1/speed-up), the speed-up measured on the whole float and int8 models" + _SPLIT)


class OpenVinoLayerTiming(_ProfiledTiming):
    """OpenVINO CPU: per-layer performance counters of the float model (f32), scaled by the measured speed-up."""

    target = "openvino:cpu"
    how = ("model calibrated by measurement: OpenVINO's per-layer performance counters of the float model (f32) "
           "times (1 - 1/speed-up), the speed-up measured on the whole float and int8 models" + _SPLIT)


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
    comparison: BudgetComparison
    added_seconds: dict[str, float]

    def finding(self) -> FrontPointRecord:
        return FrontPointRecord(found_by=self.found_by, kept_float=sorted(self.kept), holds=self.holds,
                                task_or_error=self.comparison,
                                added_seconds_per_inference={target: float(f"{value:.4g}")
                                                             for target, value in self.added_seconds.items()},
                                recipe={"exclude_nodes": sorted(self.kept)})


def added_seconds(kept: Sequence[str], costs: dict[str, dict[str, float]]) -> dict[str, float]:
    return {target: sum(per_node.get(name, 0.0) for name in kept) for target, per_node in costs.items()}


def fastest(points: list[Point], primary: str) -> int:
    """The index of the point that holds with the fewest added seconds on ``primary``; -1 when none holds."""
    holding = [index for index, point in enumerate(points) if point.holds]
    if not holding:
        return -1
    return min(holding, key=lambda index: (points[index].added_seconds.get(primary, 0.0), len(points[index].kept)))


def _per_candidate(layers: list[LayerTime], candidates: Sequence[str]) -> dict[str, float]:
    """Seconds per run of each candidate: the layers that hold it, a layer's time split equally among the candidates
    it holds (a fused layer's time cannot be told apart; its other nodes, a BatchNormalization or a Relu, are no
    candidates and cost nothing kept float on their own)."""
    wanted = set(candidates)
    seconds = dict.fromkeys(candidates, 0.0)
    for layer in layers:
        held = [node for node in dict.fromkeys(layer.nodes) if node in wanted]
        for node in held:
            seconds[node] += layer.time_ms * 1e-3 / len(held)
    return seconds


def _scaled(per_candidate: dict[str, float], float_ms: float, int8_ms: float,
            candidates: Sequence[str]) -> dict[str, float]:
    """Per candidate: its float time times (1 - 1/speed-up): what it saves when int8, so what it costs kept
    float.  A speed-up at or below 1 still orders by float time (a small floor)."""
    speedup = float_ms / int8_ms if int8_ms > 0 else 1.0
    share = max(1.0 - 1.0 / speedup, 0.05) if speedup > 0 else 0.05
    return {name: per_candidate.get(name, 0.0) * share for name in candidates}


def _save(model: onnx.ModelProto, path: Path) -> None:
    import onnx

    onnx.save(model, str(path), save_as_external_data=needs_external_data(model))
