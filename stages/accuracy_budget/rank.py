"""How the accuracy budget ranks the candidates (nodes the stage can keep float), most harmful first.

- ``local``: the stage's own signal, the error each candidate adds by itself (int8: one run of the fully quantized
  model with a float copy of every candidate node, ``qdeploy.stages.quantize.budget``).  It does not see what
  happens downstream (a LayerNorm that amplifies an outlier channel).
- ``alone``: for models with at most ``ALONE_RANK_LIMIT`` candidates, each
  node is also reduced on its own (every other candidate float) and the
  rise of the error ratio (``evaluate.error_ratio``) is its
  damage: one evaluation per candidate on ``RANK_SAMPLES`` samples.  It sees
  downstream effects, but not errors that only show summed over many layers
  (a saturating output hides each one): nodes without measurable damage
  keep the local order.

The ranking is by alone damage, then local error.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from qdeploy.stages.accuracy_budget.evaluate import Evaluator, Feeds, error_ratio

if TYPE_CHECKING:
    pass

__all__ = ["ALONE_RANK_LIMIT", "RANK_SAMPLES", "LocalErrors", "Ranked", "alone_damage", "rank_candidates"]

log = logging.getLogger(__name__)

RANK_SAMPLES = 4
"""Search samples the ranking measures on."""
ALONE_RANK_LIMIT = 64
"""Most candidates whose damage is also measured one model per node (cost: one evaluation each)."""


LocalErrors = Callable[[list[Feeds]], dict[str, float]]
"""The stage's ranking signal: per candidate, the error it adds by itself on these samples."""


@dataclass(frozen=True)
class Ranked:
    name: str
    local: float
    """Noise-to-signal ratio the node adds at its outputs."""
    alone: float | None
    """Rise of the error ratio with only this node quantized; None when not measured."""


def rank_candidates(build: Any, evaluate: Evaluator, candidates: dict[str, str], local: LocalErrors,
                    on_progress: Callable[[str], None],
                    check: Callable[[str], None] = lambda phase: None) -> tuple[list[Ranked], str]:
    """The candidates, most harmful first, and how they were ranked; ``local(feeds)``: the stage's error per
    candidate on the first search samples; ``check`` is called before each evaluation (it raises when the budget's
    time is up).  With a task metric the ranking is the local error alone: a rate over 4 samples cannot tell one
    node's damage from another's."""
    on_progress("accuracy budget: ranking the candidates by the error they add")
    local_error = local(evaluate.search_feeds[:RANK_SAMPLES])
    alone: dict[str, float] = {}
    method = "local error (one run)"
    if len(candidates) <= ALONE_RANK_LIMIT and evaluate.judge is None:
        alone = alone_damage(build, evaluate, list(candidates), on_progress, check)
        method = f"damage quantized alone ({len(candidates)} evaluations), then local error"
    order = {name: index for index, name in enumerate(candidates)}
    ranked = [Ranked(name, local_error[name], alone.get(name)) for name in candidates]
    ranked.sort(key=lambda item: (-max(item.alone or 0.0, 0.0), -item.local, order[item.name]))
    return ranked, method


def alone_damage(build: Any, evaluate: Evaluator, names: list[str], on_progress: Callable[[str], None],
                 check: Callable[[str], None] = lambda phase: None) -> dict[str, float]:
    """Per node: the error ratio with only it quantized minus the ratio with every candidate float."""
    def ratio(kept: list[str]) -> float:
        check("ranking")
        measured = evaluate.measure(build(kept), samples=RANK_SAMPLES)
        value = error_ratio(evaluate.on_search(measured), evaluate.tolerance)
        return value if math.isfinite(value) else 1e9

    on_progress("accuracy budget: the model with every candidate float")
    baseline = ratio(names)
    damage = {}
    for index, name in enumerate(names, 1):
        on_progress(f"accuracy budget: node {index}/{len(names)} quantized alone")
        damage[name] = ratio([other for other in names if other != name]) - baseline
    return damage
