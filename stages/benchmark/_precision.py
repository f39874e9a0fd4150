"""The inference precision a benchmark row runs with: the setting its artifact is shipped with on that target.

Float32 artifacts are pinned to f32 on OpenVINO, as validation pins them (the reference's ``fp32@default`` row
excepted: it is the float32 file at the device default); fp16 and int8 artifacts run at the device default
(bfloat16 on CPUs with AVX512-BF16 or AMX), unless validation found that default missing the tolerance and a pinned
precision holding (``ValidationRow.deploy_precision``): the benchmark then times that pinned setting, the one the
package ships, and the row says so.  A weight-only artifact's ``@f32`` row is pinned to f32 (its deployment
setting, ``qdeploy.core.runtimes.pinned_f32_name``).  Under $QDEPLOY_CPU_FLAGS the device default is that CPU's
default, asked for explicitly, as validation asks for it (``cpu_facts.default_hint``): a row never validates one
precision and times another.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, TypedDict

from qdeploy.core.rows import ValidationRow
from qdeploy.targets.cpu_facts import default_hint

if TYPE_CHECKING:
    from qdeploy.core.context import Artifact

__all__ = ["LoadOptions", "PrecisionHintField", "Shipped", "load_options", "precision_record", "shipped_precisions"]

Shipped = dict[tuple[str, str], str]
"""(variant, target) -> the INFERENCE_PRECISION_HINT validation ships it with, where the default missed."""


def shipped_precisions(rows: Iterable[ValidationRow]) -> Shipped:
    """The pinned precisions validation ships, by (variant, target)."""
    return {(row.variant, row.target): row.deploy_precision for row in rows if row.deploy_precision}


def _hint(name: str, artifact: Artifact, target: str, shipped: Shipped | None) -> str | None:
    if not target.startswith("openvino:"):
        return None
    return (shipped or {}).get((name, target)) or ("f32" if _pinned_f32(artifact) else default_hint(target)[0])


def _pinned_f32(artifact: Artifact) -> bool:
    """Float32 artifacts run pinned to f32, except the device-default row of the reference; so do the ``@f32``
    rows of weight-only artifacts."""
    return artifact.pinned_f32 or (artifact.precision == "fp32" and not artifact.at_device_default)


class LoadOptions(TypedDict, total=False):
    """Keyword arguments of a target's ``load``/``open_pool``: pin float32, or pin this INFERENCE_PRECISION_HINT."""

    pin_f32: bool
    precision: str


class PrecisionHintField(TypedDict, total=False):
    """A benchmark row's ``precision_hint`` (OpenVINO rows only; None: the device default)."""

    precision_hint: str | None


def load_options(name: str, artifact: Artifact, target: str, shipped: Shipped | None) -> LoadOptions:
    """Keyword arguments of ``load``/``open_pool``: validation's pinning, and the shipped pin where there is one."""
    pinned = (shipped or {}).get((name, target)) if target.startswith("openvino:") else None
    if pinned is None and not _pinned_f32(artifact):
        pinned = default_hint(target)[0]  # the injected CPU's default, as validation loads it; None: the device's
    return {"pin_f32": _pinned_f32(artifact), **({"precision": pinned} if pinned else {})}


def precision_record(name: str, artifact: Artifact, target: str,
                     shipped: Shipped | None) -> tuple[PrecisionHintField, list[str]]:
    """The row's ``precision_hint`` field (OpenVINO rows only) and a note when it is a shipped pin."""
    if not target.startswith("openvino:"):
        return {}, []
    hint = _hint(name, artifact, target, shipped)
    pinned = (shipped or {}).get((name, target))
    why = ("its activations in float32, as the weight-only file declares them" if artifact.pinned_f32
           else "the device default missed its tolerance")
    notes = [f"timed with INFERENCE_PRECISION_HINT {pinned} pinned: the setting validation ships for this artifact "
             f"on {target} ({why})"] if pinned else []
    return {"precision_hint": hint}, notes
