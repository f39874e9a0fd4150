"""What the accuracy budget's findings say in words: why each node is kept float, the held-back verdict, why
the budget missed."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from qdeploy.stages.quantize.budget._targets import MISSED
from qdeploy.stages.task_metric import MetricComparison

if TYPE_CHECKING:
    from qdeploy.stages.quantize.budget._eval import Evaluator, Measured
    from qdeploy.stages.quantize.budget._rank import Ranked
    from qdeploy.stages.quantize.budget._targets import Combined, CombinedMeasured, TargetChecks
    from qdeploy.stages.quantize.findings import TargetRecord


def kept_records(kept: list[str], ranked: list[Ranked], candidates: dict[str, str], needed: set[str],
                 front: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Per node kept float: its rank and why; ``front``: the latency-aware search chose the set."""
    rank = {item.name: (index, item) for index, item in enumerate(ranked, 1)}
    cheaper = front is not None and front.get("chosen") == 2
    records = []
    for name in kept:
        position, item = rank[name]
        why = f"ranked {position} of {len(ranked)} by the error it adds; in the shortest ranked prefix that holds " \
              "the tolerance"
        if cheaper:
            why = (f"ranked {position} of {len(ranked)} by the error it adds; in the shortest prefix of the "
                   f"harm-per-second order that holds the tolerance (latency-aware, on {front['chosen_by']})")
        if name in needed and not cheaper:
            why += "; quantizing it again on its own broke the tolerance"
        record = {"node": name, "op_type": candidates[name], "rank": position,
                  "added_noise_to_signal": _rounded(item.local), "reason": why}
        if item.alone is not None:
            record["error_ratio_rise_quantized_alone"] = _rounded(item.alone)
        records.append(record)
    return records


def confirmation(held_count: int, evaluate: Evaluator | Combined, measured: Measured | CombinedMeasured) -> str:
    if held_count == 0:
        return "unchecked: a single budget sample, none could be held back; give budget.samples >= 2"
    held = evaluate.on_held(measured)
    verdict = f"the tolerance {'holds' if held.passed else 'misses'} on {held_count} held-back sample(s)"
    if isinstance(held, MetricComparison):
        drop = "not computed" if held.drop is None else f"{held.drop:.4g} of {held.allowed:.4g} allowed"
        return f"{verdict} (task metric drop {drop})"
    cosine = held.worst().get("cosine")
    return f"{verdict} (worst cosine {cosine:.4g})" if cosine is not None else verdict


def miss_note(kept: list[str], ranked: list[Ranked], limit: int, phases: list[Any], tried: list[Any], rounds: int,
               checks: TargetChecks) -> str:
    last = phases[-1].searched_on
    everything = any(trial.float_nodes == len(ranked) and trial.phase == "prefix" and not trial.passed
                     and trial.on == last for trial in tried)
    if limit < len(ranked):
        reason = f"max_float_nodes ({limit}) was reached"
    elif everything:
        reason = ("even with every candidate kept float the tolerance misses: the error comes from what is not a "
                  "candidate (data movement, the float parts' numerics on that runtime); see 'tried'")
    else:
        reason = f"no ranked prefix held it after {phases[-1].margin.get('rounds', rounds)} round(s) (see 'tried')"
    missed = {name: record for name, record in checks.records.items() if record.status == MISSED}
    if missed and phases[-1].met_there is False:
        reason += f", searching with the measurements of {last}"
    for record in missed.values():
        if "reason" not in record.model_fields_set:  # a runtime's own failure stays the reason
            record.reason = reason
    where = f" (misses on {', '.join(f'{name}{_ran(record)}' for name, record in missed.items())})" if missed else ""
    written = phases[-1].written or "the best model found"
    return (f"budget not met{where} with {len(kept)} of the {len(ranked)} candidates kept float: {reason}; {written} "
            "is written and marked as failing its budget")


def _ran(record: TargetRecord) -> str:
    return f", which ran {record.precision}" if record.precision else ""


def _rounded(value: float) -> float | None:
    return None if not math.isfinite(value) else float(f"{value:.4g}")
