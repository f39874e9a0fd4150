"""The reference at the device's default precision: the row a user who does not quantize would deploy.

OpenVINO runs float32 models in bfloat16 by default on CPUs with AVX512-BF16 or AMX.  The reference row pins f32
(right for a reference), so every speedup against it credits int8 and fp16 with what bf16 execution alone gives.
Where a target of the plan runs float32 below float32 by default, the run evaluates the reference artifact once
more as ``fp32@default`` (``qdeploy.core.runtimes.device_default_name``) on those runtimes' targets: validated like
any variant (held to the tolerance of the precision that ran), timed in the same interleaved rounds, and a
candidate of the verdict, which may ship it.

On the same targets each weight-only artifact (quantized weights, float activations) is evaluated once more as
``<variant>@f32`` (``qdeploy.core.runtimes.pinned_f32_name``): pinned to f32, its activations in float32 as the
file declares them.  Which setting is faster depends on the CPU and the call: on an AMX Xeon OpenVINO's int4 decode
step ran about 1.3 times faster pinned to f32 than at its bf16 default, and its 128-token prefill slower.  Both rows
are validated and timed; the verdict ships the faster one that passed, and its package pins the hint.
"""

from __future__ import annotations

import dataclasses
import logging

from qdeploy.core.context import Artifact
from qdeploy.core.runtimes import DEVICE_DEFAULT_RUNTIMES, device_default_name, pinned_f32_name, runtime_of_target
from qdeploy.stages.benchmark.config import BenchmarkConfig
from qdeploy.targets import get_target
from qdeploy.targets.cpu_facts import device_precisions

__all__ = ["reduced_default_targets", "with_device_default", "with_pinned_f32", "with_setting_rows"]

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


def with_pinned_f32(evaluated: dict[str, Artifact], targets: list[str], enabled: bool) -> dict[str, Artifact]:
    """``evaluated`` plus ``<variant>@f32`` right after each weight-only artifact, where a target of the plan runs
    float parts below float32 by default."""
    weight_only = [name for name, item in evaluated.items() if not item.at_device_default and item.weight_only]
    if not enabled or not weight_only:
        return evaluated
    reduced = reduced_default_targets(targets)
    if not reduced:
        return evaluated
    log.info("weight-only artifacts %s are also evaluated with float32 activations on %s (rows <variant>@f32)",
             ", ".join(weight_only), ", ".join(reduced))
    added: dict[str, Artifact] = {}
    for name, item in evaluated.items():
        added[name] = item
        if name in weight_only:
            added[pinned_f32_name(name)] = dataclasses.replace(item, pinned_f32=True)
    return added


def with_setting_rows(evaluated: dict[str, Artifact], reference: str, targets: list[str],
                      benchmark: BenchmarkConfig) -> dict[str, Artifact]:
    """``evaluated`` plus the rows at other precision settings the benchmark config asks for."""
    evaluated = with_device_default(evaluated, reference, targets, benchmark.enabled and benchmark.device_default)
    return with_pinned_f32(evaluated, targets, benchmark.enabled and benchmark.weight_only_f32)
