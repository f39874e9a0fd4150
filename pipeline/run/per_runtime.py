"""``per_runtime: auto`` at build time: one graph for both runtimes where their placements agree, one each else.

A ptq variant with both runtimes among its targets is split at load into ``v@ort`` and ``v@openvino`` (the
recipe's ``_split_per_runtime``), both with the config as written.  Before either build, ``build_config`` decides
on the model the step receives whether the two runtimes' placements differ (``stages/quantize/ptq/_placement.py``: a
preparation and two quantizer passes, no calibration).  Where they agree, both builds keep the written config:
one cache key, one build, one file (``pipeline/run/dedup.py`` marks the second name ``same_file_as`` the first).
Where they differ, each build gets the config specialised for its runtime (``PtqConfig.for_runtime``), and the
second build reuses the first's calibration ranges (``stages/quantize/ptq/_shared_ranges.py``).
The step says whether it builds per runtime through its settings' declaration (``StageConfig.per_runtime_build``);
what the builds' placements showed stays in the run's build state (``placements``), never on the recipe, and
``note_runtime_builds`` turns it into one ``PerRuntimeDecision`` per variant: the build outcome keeps them, and
each build's artifacts row says which happened.
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Final, Protocol

from qdeploy.core.context import Artifact
from qdeploy.core.runtimes import RUNTIMES, runtime_of_variant, split_name
from qdeploy.core.stage_config import StageConfig
from qdeploy.pipeline.publish.store import ArtifactStore, cache_key, library_versions
from qdeploy.pipeline.recipe.schema import Recipe, VariantStep
from qdeploy.pipeline.run.published_rows import PerRuntimeEntryDict, PublishedArtifactRow
from qdeploy.stages.quantize import placement_differences
from qdeploy.targets.int8_path import cpu_flags

__all__ = ["PER_RUNTIME_KEY", "PerRuntimeDecision", "Placement", "auto_splits", "build_config", "note_runtime_builds",
           "plan_lines"]

PER_RUNTIME_KEY: Final = "per_runtime"
"""Key of a per-runtime build's artifacts row: how many graphs the variant became, and why."""
_SHOWN_NODES = 8

log = logging.getLogger(__name__)


class _Building(Protocol):
    """What ``build_config`` reads of the runner's build state, and where it keeps what it decided."""

    store: ArtifactStore
    use_cache: bool
    work_root: Path
    placements: dict[str, Placement]
    """Variant as written -> what its ``auto`` step's placements showed on the model it received."""


@dataclass(frozen=True)
class Placement:
    """Whether a variant's runtimes want different graphs: the compute nodes whose Q/DQ placement differs."""

    differs_at: list[str]
    seconds: float
    """How long deciding took (0 when an earlier run's decision was read)."""
    key: str = ""
    """What was decided: the step's config and its input model, hashed."""
    error: str = ""
    """Why deciding failed (then each runtime gets its own build: never the other runtime's graph unchecked)."""

    @property
    def split(self) -> bool:
        return bool(self.differs_at or self.error)


@dataclass(frozen=True)
class PerRuntimeDecision:
    """What ``per_runtime: auto`` made of one variant as written: one graph for both runtimes or one each, why,
    and what deciding cost; each build's artifacts row carries it (``row``)."""

    variant: str
    builds: tuple[str, ...]
    graphs: int
    differs_at: int
    """Compute nodes whose placement differs (0 where the builds are one graph)."""
    nodes: tuple[str, ...]
    """The first of those nodes, by name."""
    decision_seconds: float
    note: str

    def row(self) -> PerRuntimeEntryDict:
        """The ``per_runtime`` entry of each build's artifacts row."""
        return {"graphs": self.graphs, "differs_at": self.differs_at, "nodes": list(self.nodes),
                "decision_seconds": self.decision_seconds, "note": self.note}


def build_config(state: _Building, variant: str, step: VariantStep, parent: Artifact) -> StageConfig:
    """The config ``step`` builds ``variant`` with: as written, unless it is an ``auto`` ptq step of a runtime's
    build whose runtimes' placements differ on ``parent``; then specialised for the variant's runtime."""
    config = step.config
    runtime = runtime_of_variant(variant)
    if runtime is None or config.per_runtime_build() != "auto":
        return config
    base = variant.rpartition("@")[0]
    placement = _decide(state, config, parent, state.placements.get(base))
    state.placements[base] = placement
    return config.for_runtime(runtime) if placement.split else config


def _decide(state: _Building, config: StageConfig, parent: Artifact, known: Placement | None) -> Placement:
    """The placement decision for ``config`` on ``parent``: ``known`` (the other runtime's build decided it), or
    from the cache folder where an earlier run made it, else made now."""
    key = cache_key({"decision": "per_runtime placement", "config": config.model_dump(mode="json"),
                     "parent_sha256": parent.sha256, "parent_external_data": [list(i) for i in parent.external_data],
                     "versions": library_versions(("qdeploy", "onnx", "onnxruntime")),
                     "amx_int8": "amx_int8" in cpu_flags()[0]})  # ONNX Runtime's graph routes convs on AMX
    if known is not None and known.key == key:
        return known
    saved = state.store.root / "placements" / f"{key}.json"
    if state.use_cache and saved.is_file():
        return Placement(differs_at=json.loads(saved.read_text())["differs_at"], seconds=0.0, key=key)
    started = time.perf_counter()
    try:
        differs_at = placement_differences(parent.path, config, state.work_root / f"placement-{key[:12]}")
    except Exception as exc:  # the builds themselves say what is wrong with the model; here: one graph each
        log.warning("per_runtime auto: could not compare the runtimes' placements (%s: %s); one build per "
                    "runtime", type(exc).__name__, exc)
        return Placement([], time.perf_counter() - started, key, error=f"{type(exc).__name__}: {exc}"[:200])
    placement = Placement(differs_at=differs_at, seconds=time.perf_counter() - started, key=key)
    saved.parent.mkdir(parents=True, exist_ok=True)
    temporary = saved.with_name(f".tmp-{os.getpid()}-{saved.name}")
    temporary.write_text(json.dumps(asdict(placement)))
    os.replace(temporary, saved)
    return placement


def note_runtime_builds(published: list[PublishedArtifactRow],
                        placements: dict[str, Placement]) -> dict[str, PerRuntimeDecision]:
    """What ``per_runtime: auto`` decided for each variant of ``placements`` (the build state's): "one graph for both
    runtimes: placements agree" or "one graph per runtime: placements differ at N nodes", with what deciding cost;
    added to each of its builds' artifacts rows."""
    rows = {row["name"]: row for row in published}
    decisions = {}
    for base, placement in placements.items():
        builds = [rows[name] for name in (split_name(base, runtime) for runtime in RUNTIMES) if name in rows]
        nodes, split = placement.differs_at, placement.split
        if split and len(builds) > 1 and len({row["sha256"] for row in builds}) == 1:
            nodes, split = [], False  # placeholder ranges saw a difference the calibrated builds lack: one file
        if placement.error and split:
            note = f"one graph per runtime: the placements could not be compared ({placement.error})"
        elif split:
            shown = ", ".join(nodes[:_SHOWN_NODES]) + (", ..." if len(nodes) > _SHOWN_NODES else "")
            note = f"one graph per runtime: placements differ at {len(nodes)} nodes ({shown})"
        else:
            note = "one graph for both runtimes: placements agree"
        cost = f"deciding took {placement.seconds:.2f} s" if placement.seconds else "decided by an earlier run"
        if split and len(builds) > 1:  # the extra cost: the second graph's build (its calibration shared)
            cost += "; builds " + ", ".join(f"{row['name']} {row['seconds']:.2f} s" for row in builds
                                           if isinstance(row.get("seconds"), (int, float)))
        decision = PerRuntimeDecision(base, tuple(row["name"] for row in builds), 2 if split else 1, len(nodes),
                                      tuple(nodes[:_SHOWN_NODES]), round(placement.seconds, 3), f"{note}; {cost}")
        for row in builds:
            row[PER_RUNTIME_KEY] = decision.row()
        decisions[base] = decision
    return decisions


def auto_splits(recipe: Recipe) -> dict[str, list[str]]:
    """Variant as written -> its runtimes' builds, for variants that ``per_runtime: auto`` split."""
    splits: dict[str, list[str]] = {}
    for name, steps in recipe.variants.items():
        if runtime_of_variant(name) and any(step.config.per_runtime_build() == "auto" for step in steps):
            splits.setdefault(name.rpartition("@")[0], []).append(name)
    return splits


def plan_lines(recipe: Recipe) -> list[str]:
    """What ``qdeploy check`` says of the auto splits: decided on the model, at build time."""
    return [f"per_runtime auto: {base} -> {', '.join(builds)}: one build for both where the runtimes' "
            "placements agree on the model, one each where they differ (decided when built)"
            for base, builds in auto_splits(recipe).items()]
