"""The reference at the device's default precision: the row a user who does not quantize would deploy.

OpenVINO runs float32 models in bfloat16 by default on CPUs with AVX512-BF16 or AMX.  The reference row pins f32
(right for a reference), so every speedup against it credits int8 and fp16 with what bf16 execution alone gives.
Where a target of the plan runs float32 below float32 by default, the run evaluates the reference artifact once
more as ``fp32@default`` (``qdeploy.core.runtimes.device_default_name``) on those runtimes' targets: validated like
any variant (held to the tolerance of the precision that ran), timed in the same interleaved rounds, and a
candidate of the verdict, which may ship it.
"""

from __future__ import annotations

import dataclasses
import logging

from qdeploy.core.context import Artifact
from qdeploy.core.runtimes import DEVICE_DEFAULT_RUNTIMES, device_default_name, runtime_of_target
from qdeploy.targets import get_target
from qdeploy.targets.cpu_facts import device_precisions

__all__ = ["reduced_default_targets", "with_device_default"]

log = logging.getLogger(__name__)


def reduced_default_targets(targets: list[str]) -> list[str]:
    """The plan's available targets whose device runs float32 models below float32 unless told otherwise."""
    chosen = []
    for target in targets:
        if runtime_of_target(target) not in DEVICE_DEFAULT_RUNTIMES or not get_target(target).availability()[0]:
            continue
        facts = device_precisions(target.partition(":")[2])
        if facts.reduced_default:
            chosen.append(target)
    return chosen


def with_device_default(evaluated: dict[str, Artifact], reference: str, targets: list[str],
                        enabled: bool) -> dict[str, Artifact]:
    """``evaluated`` plus ``fp32@default`` right after the reference, where it applies."""
    artifact = evaluated.get(reference)
    if not enabled or artifact is None or artifact.precision != "fp32":
        return evaluated
    reduced = reduced_default_targets(targets)
    if not reduced:
        return evaluated
    log.info("%s: float32 runs below float32 by default on %s: %s is evaluated there as its own row", reference,
             ", ".join(reduced), device_default_name(reference))
    added: dict[str, Artifact] = {}
    for name, item in evaluated.items():
        added[name] = item
        if name == reference:
            added[device_default_name(reference)] = dataclasses.replace(item, at_device_default=True)
    return added
