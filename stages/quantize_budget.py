"""The accuracy budget: keep the most harmful quantized nodes in float until the tolerance holds.

1. The fully quantized model is compared with the float model on the budget
   data (``pipeline.compare``, the same metrics validation uses).  If it holds
   the tolerance, nothing more is done.
2. Each quantized node's contribution to the error is measured on its own: the
   model is built with that node alone quantized (every other candidate float),
   and the drop of the worst output's cosine similarity from the all-float
   model is its damage (on the first RANK_SAMPLES budget samples: one model per
   candidate).  Measured with everything else quantized instead, a
   node's share vanishes in the accumulated error of the others.  Data-movement
   ops (Reshape, Transpose...) add no rounding and are not candidates; they
   follow their consumers.
3. The most harmful nodes are kept float, fewest first, until the tolerance
   holds: the shortest prefix of the ranking that meets it is found by doubling
   and then bisection (a prefix longer than a passing one passes too, in
   practice), and the search stops there.  When no prefix meets it (or
   ``max_float_nodes`` is reached), the best model found is returned and marked
   as failing its budget.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from pipeline.compare import Comparison, compare_outputs

if TYPE_CHECKING:
    import onnx

    from pipeline.tolerance import Tolerance

log = logging.getLogger(__name__)

Feeds = dict[str, np.ndarray]

RANK_SAMPLES = 4
"""Budget samples each node's contribution is measured on (one run per candidate node: kept small)."""


class Builder(Protocol):
    """Builds the quantized model with some nodes kept float, and names the nodes it could keep float."""

    def __call__(self, kept: list[str]) -> onnx.ModelProto: ...

    def candidates(self, quantized: onnx.ModelProto) -> dict[str, str]: ...


@dataclass
class BudgetResult:
    model: onnx.ModelProto
    kept: list[str]
    """Nodes the budget kept in float."""
    findings: dict[str, Any]


@dataclass
class _Trial:
    kept: list[str]
    model: onnx.ModelProto
    comparison: Comparison

    @property
    def score(self) -> float:
        return _score(self.comparison)


def _score(comparison: Comparison) -> float:
    """Worst cosine over the outputs (higher is better); -inf when no float output has one."""
    worst = comparison.worst()
    cosine = worst.get("cosine")
    return float(cosine) if cosine is not None else float("-inf")


def _summary(comparison: Comparison) -> dict[str, Any]:
    worst = comparison.worst()
    return {"passed": comparison.passed, "cosine": worst.get("cosine"), "snr_db": worst.get("snr_db"),
            "top1_agreement": worst.get("top1_agreement"), "reasons": comparison.reasons[:3]}


class _Evaluator:
    """Runs candidate models in ONNX Runtime on the budget feeds and compares them with the float outputs."""

    def __init__(self, float_model: Path, feeds: list[Feeds], tolerance: Tolerance, work_dir: Path) -> None:
        self.feeds = feeds
        self.tolerance = tolerance
        self.work_dir = work_dir
        self.reference = self._outputs(str(float_model))
        self.count = 0

    def _outputs(self, path: str, count: int | None = None) -> list[dict[str, np.ndarray]]:
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.log_severity_level = 3
        session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
        names = [out.name for out in session.get_outputs()]
        return [dict(zip(names, session.run(names, feed), strict=True)) for feed in self.feeds[:count]]

    def __call__(self, model: onnx.ModelProto, samples: int | None = None) -> Comparison:
        """The comparison on every budget sample, or on the first ``samples`` of them."""
        import onnx

        self.count += 1
        path = self.work_dir / "budget_candidate.onnx"
        onnx.save(model, str(path), save_as_external_data=model.ByteSize() > 1_800_000_000)
        return compare_outputs(self.reference[:samples], self._outputs(str(path), samples), self.tolerance)


def meet_budget(build: Builder, float_model: Path, feeds: list[Feeds], tolerance: Tolerance, work_dir: Path, *,
                max_float_nodes: int | None, on_progress: Callable[[str], None] = lambda message: None) -> BudgetResult:
    """The quantized model that holds the tolerance with the fewest nodes kept in float (see the module doc);
    ``build(kept)`` returns the model with those nodes kept in float."""
    evaluate = _Evaluator(float_model, feeds, tolerance, work_dir)
    full = _trial(build, evaluate, [])
    findings: dict[str, Any] = {"tolerance": tolerance.model_dump(exclude_none=True), "samples": len(feeds),
                                "initial": _summary(full.comparison)}
    if full.comparison.passed:
        return BudgetResult(full.model, [], {**findings, "met": True, "kept_float": [],
                                             "final": findings["initial"], "evaluations": evaluate.count})
    candidates = build.candidates(full.model)
    ranked = _rank(build, candidates, evaluate, on_progress)
    limit = len(ranked) if max_float_nodes is None else min(len(ranked), max_float_nodes)
    best = _shortest_prefix(build, ranked[:limit], full, evaluate, on_progress)
    damage = {name: (drop, alone) for name, drop, alone in ranked}
    kept_records = [{"node": name, "op_type": candidates[name],
                     "cosine_when_only_it_is_quantized": round(damage[name][1], 6),
                     "reason": f"quantized alone, it lowers the worst cosine by {damage[name][0]:.4g}"}
                    for name in best.kept]
    findings.update(met=best.comparison.passed, final=_summary(best.comparison), kept_float=kept_records,
                    candidates=len(candidates), harmful=len(ranked), evaluations=evaluate.count)
    if not best.comparison.passed:
        findings["note"] = (f"budget not met with {len(best.kept)} of the {len(ranked)} harmful nodes kept float; "
                            f"the best model found (worst cosine {best.score:.4g}) is written and marked as "
                            "failing its budget")
        log.warning("quantize: accuracy budget not met: %s", findings["note"])
    return BudgetResult(best.model, sorted(best.kept), findings)


def _trial(build: Builder, evaluate: _Evaluator, kept: list[str]) -> _Trial:
    model = build(list(kept))
    return _Trial(list(kept), model, evaluate(model))


def _rank(build: Builder, candidates: dict[str, str], evaluate: _Evaluator,
          on_progress: Callable[[str], None]) -> list[tuple[str, float, float]]:
    """(node, damage, cosine) for nodes that hurt, most harmful first: the worst cosine with that node alone
    quantized, and its drop from the all-float model's."""
    names = list(candidates)
    on_progress("accuracy budget: the model with every candidate float")
    baseline = _score(evaluate(build(names), RANK_SAMPLES))
    damages = []
    for index, name in enumerate(names, 1):
        on_progress(f"accuracy budget: contribution of node {index}/{len(names)}")
        alone = _score(evaluate(build([other for other in names if other != name]), RANK_SAMPLES))
        damages.append((name, baseline - alone, alone))
    return sorted([item for item in damages if item[1] > 0], key=lambda item: -item[1])


def _shortest_prefix(build: Builder, ranked: list[tuple[str, float, float]], full: _Trial, evaluate: _Evaluator,
                     on_progress: Callable[[str], None]) -> _Trial:
    """The fewest most-harmful nodes kept float that meet the tolerance (doubling, then bisection); the best
    trial seen when no prefix meets it."""
    names = [name for name, _, _ in ranked]
    trials: dict[int, _Trial] = {0: full}

    def attempt(count: int) -> _Trial:
        if count not in trials:
            on_progress(f"accuracy budget: {count} node(s) kept float")
            trials[count] = _trial(build, evaluate, names[:count])
        return trials[count]

    failing, passing = 0, None
    count = 1
    while count <= len(names) and passing is None:
        if attempt(count).comparison.passed:
            passing = count
        else:
            failing, count = count, count * 2
    if passing is None and names and attempt(len(names)).comparison.passed:
        passing = len(names)
    if passing is None:
        return max(trials.values(), key=lambda trial: trial.score)
    while passing - failing > 1:
        middle = (failing + passing) // 2
        if attempt(middle).comparison.passed:
            passing = middle
        else:
            failing = middle
    return trials[passing]
