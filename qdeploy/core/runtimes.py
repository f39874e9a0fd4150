"""Variants built for one runtime: a variant named ``<name>@<runtime>`` runs only on that runtime's targets.

``quantize: {per_runtime: true}`` splits one variant line into ``int8@ort`` and ``int8@openvino`` (the best
int8 graph differs between the runtimes); a user may also name such variants by hand.  Validation, benchmarks,
gates and the "unmeasured" check pair such a variant with its own runtime's targets only.
"""

from __future__ import annotations

__all__ = ["RUNTIMES", "built_for", "runtime_of_target", "runtime_of_variant", "split_name"]

RUNTIMES = ("ort", "openvino")
"""Runtime families a variant can be built for (the part of a target before ':')."""


def runtime_of_target(target: str) -> str:
    """'ort' for 'ort:cpu', 'openvino' for 'openvino:gpu', 'reference' for 'reference:cpu'."""
    return target.partition(":")[0]


def runtime_of_variant(variant: str) -> str | None:
    """The runtime a variant is built for ('int8@openvino' -> 'openvino'), None for one built for every target."""
    base, at, runtime = variant.rpartition("@")
    return runtime if at and base and runtime in RUNTIMES else None


def built_for(variant: str, target: str) -> bool:
    """Whether ``variant`` is evaluated on ``target``: always, unless it is built for another runtime."""
    runtime = runtime_of_variant(variant)
    return runtime is None or runtime_of_target(target) == runtime


def split_name(variant: str, runtime: str) -> str:
    """The name of ``variant``'s build for ``runtime``."""
    return f"{variant}@{runtime}"
