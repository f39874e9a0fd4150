"""Which artifacts the benchmark holds loaded at once on one target: all of them, unless that would not fit.

Rounds interleave every artifact of a target so that drift of the machine hits them alike, which needs every
session loaded at once.  For large models that is the run's peak: on a 0.5 GB model (four variants and the
exported model on OpenVINO) the five compiled models held 5.9 GB at once, 11.8x the model
(docs/large-models.md).  Given a budget (``session_budget``, bytes, planned by the runner), the artifacts are
split into groups whose estimated sessions fit in it, in the recipe's order; each group is loaded, timed in its
own interleaved rounds and closed before the next is loaded.  An artifact above the budget on its own is timed
alone.  The first artifact (the reference, in the recipe's order) is timed in every group it fits in: the rows of a
later group carry its rounds of that time (``anchor``), so speedups pair round by round and the verdict compares
groups by their ratio to it, not by medians taken minutes apart on a machine that drifts (luscinia's tree ensemble:
the same float32 graph "1.83x" faster in a later group).  Rows of a split target say so.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TypeVar

from qdeploy.core.rows import BenchmarkRow, ThroughputRow
from qdeploy.core.runtimes import runtime_of_target

if TYPE_CHECKING:
    from qdeploy.core.context import Artifact

__all__ = ["SESSION_FACTORS", "anchored_rows", "float32_bytes", "session_bytes", "split_note", "split_to_fit"]

Item = TypeVar("Item")
Timed = TypeVar("Timed", BenchmarkRow, ThroughputRow)

_WIDTH = {"fp32": 1.0, "fp16": 2.0, "int8": 4.0, "int4": 8.0}
"""How many times its own bytes an artifact's weights take in float32."""
SESSION_FACTORS = {"openvino": 2.0, "openvino:int8": 3.0, "default": 1.0}
"""A loaded session's resident bytes over its weights' float32 bytes (measured on the 0.5 GB model's artifacts,
first inference included): OpenVINO's CPU plugin decompresses every precision to float32 and holds a repacked
copy beside it (fp32 and fp16 2.1x, int4 1.3x, a dynamic int8 artifact 3.1x); ONNX Runtime about 1x (fp16
weights cast to float32 on the CPU provider).  Rounded up where it matters: an estimate only decides grouping."""


def float32_bytes(artifact: Artifact) -> int:
    """The artifact's bytes as float32 weights (what a runtime that decompresses them holds)."""
    return int(artifact.size_bytes * _WIDTH.get(artifact.precision, 1.0))


def session_bytes(artifact: Artifact, target: str) -> int:
    """Estimated resident bytes of the artifact loaded and run once on ``target``."""
    runtime = runtime_of_target(target)
    factor = SESSION_FACTORS.get(f"{runtime}:{artifact.precision}", SESSION_FACTORS.get(runtime))
    return int(float32_bytes(artifact) * (factor or SESSION_FACTORS["default"]))


def split_to_fit(items: dict[str, Item], cost: dict[str, int], budget: int | None,
                 anchor: str | None = None) -> list[dict[str, Item]]:
    """``items`` in consecutive groups whose costs add up to at most ``budget`` (one group when None or all fit);
    an item above the budget alone is a group of its own.  ``anchor`` (the first artifact) joins every group it
    fits beside: timed again in each, it pairs every row with rounds of its own time (``anchored_rows``)."""
    if budget is None or sum(cost.values()) <= budget:
        return [items] if items else []
    if anchor in items and cost[anchor] < budget:
        rest = {name: item for name, item in items.items() if name != anchor}
        groups = [{anchor: items[anchor], **group} if cost[anchor] + sum(cost[name] for name in group) <= budget
                  else group for group in split_to_fit(rest, cost, budget - cost[anchor])]
        return groups if any(anchor in group for group in groups) else [{anchor: items[anchor]}, *groups]
    groups: list[dict[str, Item]] = []
    current: dict[str, Item] = {}
    spent = 0
    for name, item in items.items():
        if current and spent + cost[name] > budget:
            groups.append(current)
            current, spent = {}, 0
        current[name] = item
        spent += cost[name]
    if current:
        groups.append(current)
    return groups


def anchored_rows(rows: list[Timed], anchor: str | None) -> list[Timed]:
    """A later group's rows without the anchor's own (the first group's is the row), each carrying the anchor's
    per-round values of these rounds (``round_p50_ms`` or ``round_inferences_per_s``); the rows as they are when
    the group holds no anchor timed again."""
    if anchor is None:
        return rows
    mine = next((row for row in rows if row.variant == anchor), None)
    if mine is None or mine.status != "ok":
        return [row for row in rows if row.variant != anchor]
    key, rounds = ("round_p50_ms", mine.round_p50_ms) if isinstance(mine, BenchmarkRow) else \
        ("round_inferences_per_s", mine.round_inferences_per_s)
    return [row.replace(anchor={"variant": anchor, key: list(rounds)}) if rounds and row.status == "ok" else row
            for row in rows if row.variant != anchor]


def split_note(group: dict[str, object], target: str, total: int, budget: int) -> str:
    """What a row of a split target says: what it was timed beside, and why not beside all."""
    beside = f"in rounds interleaved with {', '.join(group)}" if len(group) > 1 else "alone"
    return (f"timed {beside} on {target}, not beside every artifact: loading all of them "
            f"at once would hold about {total / 1e9:.1f} GB, over the run's budget of {budget / 1e9:.1f} GB for "
            "sessions held at once (large model; docs/large-models.md)")
