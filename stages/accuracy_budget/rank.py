"""How the accuracy budget ranks the candidates (nodes the stage can keep float), most harmful first.

- ``local``: the stage's own signal, the error each candidate adds by itself (int8: one run of the fully quantized
  model with a float copy of every candidate node, ``qdeploy.stages.quantize.budget``).  It does not see what
  happens downstream (a LayerNorm that amplifies an outlier channel).
- ``alone``: each node is also reduced on its own (every other candidate float) and the rise of the error ratio
  (``evaluate.error_ratio``) is its damage: one evaluation per candidate on ``RANK_SAMPLES`` samples.  It sees
  downstream effects, but not errors that only show summed over many layers (a saturating output hides each
  one): nodes without measurable damage keep the local order.  Always for at most ``ALONE_RANK_LIMIT``
  candidates; for more, when the evaluations, timed by the first of them, fit in ``ALONE_TIME_SHARE`` of the
  seconds the budget has left.  Without it, a node whose local error never reaches the output (a squeeze-excite
  convolution before a saturating HardSigmoid) ranks first and the search keeps most of a model float: PP-OCRv6
  det's ONNX Runtime build, 167 of 172 candidates float by local error, 12 with the alone ranking.

The ranking is by alone damage, then local error.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from qdeploy.stages.accuracy_budget import clock
from qdeploy.stages.accuracy_budget.evaluate import Evaluator, Feeds, error_ratio

if TYPE_CHECKING:
    pass

__all__ = ["ALONE_RANK_LIMIT", "ALONE_TIME_SHARE", "RANK_SAMPLES", "LocalErrors", "Ranked", "alone_damage",
           "rank_candidates"]

log = logging.getLogger(__name__)

RANK_SAMPLES = 4
"""Search samples the ranking measures on."""
ALONE_RANK_LIMIT = 64
"""Most candidates whose damage is always measured one model per node (cost: one evaluation each)."""
ALONE_TIME_SHARE = 0.75
"""Above ``ALONE_RANK_LIMIT``: the share of the budget's seconds left that the alone ranking may take; the rest is
the search's (PP-OCRv6 det: prefix, re-quantize and confirmation 30 evaluations after the ranking's 173)."""


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
                    on_progress: Callable[[str], None], check: Callable[[str], None] = lambda phase: None,
                    seconds_left: Callable[[], float | None] = lambda: None) -> tuple[list[Ranked], str]:
    """The candidates, most harmful first, and how they were ranked; ``local(feeds)``: the stage's error per
    candidate on the first search samples; ``check`` is called before each evaluation (it raises when the budget's
    time is up); ``seconds_left()``: the budget's, None when unbounded.  With a task metric the ranking is the
    local error alone: a rate over 4 samples cannot tell one node's damage from another's."""
    on_progress("accuracy budget: ranking the candidates by the error they add")
    local_error = local(evaluate.search_feeds[:RANK_SAMPLES])
    alone: dict[str, float] | None = None
    method = "local error (one run)"
    if evaluate.judge is None:
        bounded = seconds_left if len(candidates) > ALONE_RANK_LIMIT else (lambda: None)
        alone, why_not = alone_damage(build, evaluate, list(candidates), on_progress, check, seconds_left=bounded)
        method = (f"damage quantized alone ({len(candidates)} evaluations), then local error" if alone is not None
                  else f"{method}: {why_not}")
    alone = alone or {}
    order = {name: index for index, name in enumerate(candidates)}
    ranked = [Ranked(name, local_error[name], alone.get(name)) for name in candidates]
    ranked.sort(key=lambda item: (-max(item.alone or 0.0, 0.0), -item.local, order[item.name]))
    return ranked, method


def alone_damage(build: Any, evaluate: Evaluator, names: list[str], on_progress: Callable[[str], None],
                 check: Callable[[str], None] = lambda phase: None,
                 seconds_left: Callable[[], float | None] = lambda: None) -> tuple[dict[str, float] | None, str]:
    """Per node: the error ratio with only it quantized minus the ratio with every candidate float; None (and why)
    when the evaluations, timed by the first, would take more than ``ALONE_TIME_SHARE`` of ``seconds_left()``."""
    def ratio(kept: list[str]) -> float:
        check("ranking")
        measured = evaluate.measure(build(kept), samples=RANK_SAMPLES)
        value = error_ratio(evaluate.on_search(measured), evaluate.tolerance)
        return value if math.isfinite(value) else 1e9

    on_progress("accuracy budget: the model with every candidate float")
    started = clock.now()  # the module's: tests replace it with a fake clock
    baseline = ratio(names)
    each, left = clock.now() - started, seconds_left()
    if left is not None and len(names) * each > ALONE_TIME_SHARE * left:
        return None, (f"quantizing each of the {len(names)} candidates alone would take about "
                      f"{len(names) * each:.0f} s, over {ALONE_TIME_SHARE:.0%} of the budget's {left:.0f} s left "
                      "(budget.max_seconds gives it more)")
    damage = {}
    for index, name in enumerate(names, 1):
        on_progress(f"accuracy budget: node {index}/{len(names)} quantized alone")
        damage[name] = ratio([other for other in names if other != name]) - baseline
    return damage, ""
