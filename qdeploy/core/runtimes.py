"""Variants built for one runtime: a variant named ``<name>@<runtime>`` runs only on that runtime's targets.

``quantize: {per_runtime: true}`` splits one variant line into ``int8@ort`` and ``int8@openvino`` (the best
int8 graph differs between the runtimes), and so does the default ``auto`` where the targets hold both runtimes
(the two builds are one where the placements agree: ``qdeploy.pipeline.run.per_runtime``); a user may also name such
variants by hand.  Validation, benchmarks,
gates and the "unmeasured" check pair such a variant with its own runtime's targets only.

``fp32@default`` (``device_default_name``) is the reference artifact run at the device's default precision on
OpenVINO targets (bfloat16 on CPUs with AVX512-BF16 or AMX): what a user who deploys the float32 file without
quantizing gets there.  It is validated and timed like any variant, on OpenVINO targets only, and int8 and fp16
are weighed against it as well as against the reference pinned to float32.

``int4@f32`` (``pinned_f32_name``) is a weight-only artifact run with INFERENCE_PRECISION_HINT f32 on those same
targets: its activations in float32, as the artifact declares them, where the device's default would run them in
bfloat16.  It is its own row because which of the two is faster depends on the CPU and on the shape of the call
(on an AMX Xeon, OpenVINO's int4 decode step ran faster at f32, its prefill slower): both are measured, and the
verdict ships the faster one that passed.
"""

from __future__ import annotations

from typing import TypeVar

__all__ = ["DEVICE_DEFAULT", "DEVICE_DEFAULT_RUNTIMES", "PINNED_F32", "RUNTIMES", "artifact_of", "built_for",
           "device_default_name", "is_device_default", "is_pinned_f32", "is_setting_row", "phase_order",
           "pinned_f32_name", "runtime_groups", "runtime_of_target", "runtime_of_variant", "setting_of", "split_name",
           "variants_named"]

_Item = TypeVar("_Item")

RUNTIMES = ("ort", "openvino")
"""Runtime families a variant can be built for (the part of a target before ':')."""
DEVICE_DEFAULT = "default"
PINNED_F32 = "f32"
_SETTINGS = (DEVICE_DEFAULT, PINNED_F32)
"""Suffixes of rows that run a published artifact at another OpenVINO precision setting (no file of their own)."""
DEVICE_DEFAULT_RUNTIMES = ("openvino",)
"""Runtimes whose devices may run a float32 model below float32 by default (OpenVINO's INFERENCE_PRECISION_HINT)."""


def device_default_name(reference: str) -> str:
    """'fp32@default': the reference run at the device's default precision."""
    return f"{reference}@{DEVICE_DEFAULT}"


def pinned_f32_name(variant: str) -> str:
    """'int4@f32': the weight-only artifact ``variant`` run with its activations pinned to float32."""
    return f"{variant}@{PINNED_F32}"


def setting_of(variant: str) -> str | None:
    """'default' for 'fp32@default', 'f32' for 'int4@f32': the precision setting of a row that runs another
    row's artifact; None for a variant's own row."""
    base, at, suffix = variant.rpartition("@")
    return suffix if at and base and suffix in _SETTINGS else None


def is_device_default(variant: str) -> bool:
    return setting_of(variant) == DEVICE_DEFAULT


def is_pinned_f32(variant: str) -> bool:
    return setting_of(variant) == PINNED_F32


def is_setting_row(variant: str) -> bool:
    """Whether the row runs another row's artifact at another precision setting (OpenVINO targets only)."""
    return setting_of(variant) is not None


def artifact_of(variant: str) -> str:
    """The published artifact a row's variant runs: 'fp32' for 'fp32@default', 'int4' for 'int4@f32', the variant
    itself otherwise."""
    return variant.rpartition("@")[0] if is_setting_row(variant) else variant


def runtime_of_target(target: str) -> str:
    """'ort' for 'ort:cpu', 'openvino' for 'openvino:gpu', 'reference' for 'reference:cpu'."""
    return target.partition(":")[0]


def runtime_of_variant(variant: str) -> str | None:
    """The runtime a variant is built for ('int8@openvino' -> 'openvino'), None for one built for every target."""
    base, at, runtime = artifact_of(variant).rpartition("@")
    return runtime if at and base and runtime in RUNTIMES else None


def built_for(variant: str, target: str) -> bool:
    """Whether ``variant`` is evaluated on ``target``: always, unless it is built for another runtime (or is the
    device-default and pinned-f32 rows, which only runtimes with a reduced default have)."""
    if is_setting_row(variant):
        return runtime_of_target(target) in DEVICE_DEFAULT_RUNTIMES and built_for(artifact_of(variant), target)
    runtime = runtime_of_variant(variant)
    return runtime is None or runtime_of_target(target) == runtime


def split_name(variant: str, runtime: str) -> str:
    """The name of ``variant``'s build for ``runtime``."""
    return f"{variant}@{runtime}"


def variants_named(name: str, variants: list[str]) -> list[str]:
    """The variants a user's ``name`` selects: itself, or the builds ``per_runtime`` made of it."""
    return [name] if name in variants else [v for v in variants if runtime_of_variant(v) and
                                            v.rpartition("@")[0] == name]


def runtime_groups(artifacts: dict[str, _Item], targets: list[str]) -> list[tuple[list[str], dict[str, _Item]]]:
    """(targets, artifacts evaluated on them): one group, unless a variant is built for one runtime; then one
    group per runtime, so that such a variant meets only its own runtime's targets."""
    if not any(runtime_of_variant(name) or is_setting_row(name) for name in artifacts):
        return [(targets, artifacts)]
    groups = []
    for runtime in dict.fromkeys(runtime_of_target(target) for target in targets):
        chosen = [target for target in targets if runtime_of_target(target) == runtime]
        groups.append((chosen, {name: item for name, item in artifacts.items() if built_for(name, chosen[0])}))
    return groups


def phase_order(rows: list[_Item], variants: list[str], targets: list[str], batches: list[int]) -> list[_Item]:
    """Rows in the order one whole evaluation phase gives them, however they were made (per runtime group, per
    target on a sweep's workers): validation rows per variant, then target; timed rows (those with a
    ``batch_size``) per target, then batch, then variant."""
    def order(row: _Item) -> tuple[int, ...]:
        name, target = getattr(row, "variant"), getattr(row, "target")  # noqa: B009
        variant = variants.index(name) if name in variants else len(variants)
        place = targets.index(target) if target in targets else len(targets)
        batch = getattr(row, "batch_size", None)
        if batch is None:
            return (variant, place)
        return (place, batches.index(batch) if batch in batches else len(batches), variant)

    return sorted(rows, key=order)
