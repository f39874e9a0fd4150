"""Every calibration draw on its own: the repair's target is met by each sample, not only by their pool.

The SNR pooled over samples (sum of signal over sum of noise) is dominated by the sample with the most signal
energy and hides the others. On PP-OCRv4 det fed uniform noise (320x320) a repair that met 36 dB pooled over its
4 draws left them at 29.7, 37.1, 30.2 and 33.4 dB each, and unseen draws at 24.6 to 36.7 dB under true float16.
So the check asks each sample to meet the target (``missed_by_samples``), and the repair searches per sample
(budget mode's search on that sample alone) and keeps the union (``choose_for_every_draw``): each trial runs
one sample instead of all, so the cost stays near one search over all of them (276 s against 317 s on
PP-OCRv4 det at 320x320, 4 samples).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from qdeploy.core.compare import compare_outputs
from qdeploy.core.tolerance import Tolerance
from qdeploy.stages.fp16._budget import Float32Choice, KeptGroup, choose_float32_nodes

if TYPE_CHECKING:
    import numpy as np
    import onnx

Outputs = list[dict[str, "np.ndarray"]]

__all__ = ["choose_for_every_draw", "missed_by_samples", "sample_snrs"]


def missed_by_samples(reference: Outputs, outputs: Outputs, target: Tolerance,
                      detections: Mapping[str, Any] | None = None) -> list[str]:
    """What the pool and each sample on its own miss of ``target`` (empty: every one meets it); a detector's
    boxes (``detections``) are matched over the pool only: a sample holds a few, and one unmatched is no rate."""
    reasons = list(compare_outputs(reference, outputs, target, detections=detections).reasons)
    if len(reference) > 1 and not detections:
        for index, (want, got) in enumerate(zip(reference, outputs, strict=True)):
            reasons.extend(f"sample {index}: {reason}" for reason in compare_outputs([want], [got], target).reasons)
    return reasons


def sample_snrs(reference: Outputs, outputs: Outputs) -> list[float | None]:
    """Each sample's SNR on its own (dB, the worst output), for the findings."""
    snrs = [compare_outputs([want], [got], Tolerance()).worst()["snr_db"]
            for want, got in zip(reference, outputs, strict=True)]
    return [None if snr is None else round(snr, 2) for snr in snrs]


def choose_for_every_draw(model: onnx.ModelProto, groups: list[list[str]], float32_inputs: dict[str, set[int]],
                          feeds: list[dict[str, np.ndarray]], reference: Outputs, target: Tolerance,
                          **options: Any) -> Float32Choice:
    """Budget mode's search on each sample alone, from all float16; the union of the groups each keeps float32.

    Each search starts from all float16, not from the union of those before it: that cost less (98 s against
    135 s on PP-OCRv4 det at 192x192) but kept fewer nodes (150 against 205), and an unseen draw then scored
    30.3 dB under true float16 against 36.2.
    The ladder (what a target that misses keeps next, ``_budget_targets``) starts with the union, in the order
    of the sample that needed most, then the remaining groups in that order."""
    results = [choose_float32_nodes(model, groups, float32_inputs, [feed], [want], target, **options)
               for feed, want in zip(feeds, reference, strict=True)]
    if len(results) == 1:
        return results[0]
    neediest = max(results, key=lambda result: len(result.float32_nodes))
    chosen = {name for result in results for name in result.float32_nodes}
    order = neediest.ladder or groups
    kept_groups = [group for group in order if set(group) & chosen]
    ladder = kept_groups + [group for group in order if not set(group) & chosen]
    sensitivity = {tuple(group.nodes): group.sensitivity for result in results for group in result.kept}
    return Float32Choice(groups=len(groups), trials=sum(result.trials for result in results),
                         met=all(result.met for result in results),
                         seconds=round(sum(result.seconds for result in results), 3),
                         all_float16=neediest.all_float16,
                         kept=[KeptGroup(group, sensitivity.get(tuple(group))) for group in kept_groups],
                         ladder=ladder, chosen_count=len(kept_groups), per_sample=results)
