"""The report's artifact rows as the build phase writes them: one per published variant, with its lineage.

``qdeploy.core.report_parts.ArtifactRecord`` (and ``LineageStep``) read them into report.json; these describe
the dicts the runner builds (``_publish``), marks (``pipeline/run/dedup.py``: ``same_file_as``;
``pipeline/run/per_runtime.py``: ``per_runtime``) and hands to ``qdeploy.pipeline.results.summary.build_report``.
"""

from __future__ import annotations

from typing import Any, TypedDict

from qdeploy.pipeline.publish.published import PublishedDataFile

__all__ = ["LineageStepDict", "PerRuntimeEntryDict", "PublishedArtifactRow"]


class LineageStepDict(TypedDict):
    """One step of an artifact's chain; ``config`` and ``findings`` are the stage's own (open) JSON objects, as
    its sidecar holds them."""

    key: str
    stage: str
    cached: bool
    cache: str
    seconds: float
    config: dict[str, Any] | None
    findings: dict[str, Any] | None


class PerRuntimeEntryDict(TypedDict):
    """``per_runtime: auto``: how many graphs a variant became for its runtimes, and why."""

    graphs: int
    differs_at: int
    nodes: list[str]
    decision_seconds: float
    note: str


class _ArtifactKeys(TypedDict):
    name: str
    path: str
    sidecar: str
    sha256: str
    sidecar_sha256: str
    external_data: list[PublishedDataFile]
    size_bytes: int
    parent: str | None
    stages: list[str]
    cached: bool
    cache: str
    seconds: float
    key: str
    lineage: list[LineageStepDict]


class PublishedArtifactRow(_ArtifactKeys, total=False):
    """A published artifact's row; a twin of an earlier variant's file says whose (``same_file_as``), a build of
    ``per_runtime: auto`` what was decided (``per_runtime``)."""

    same_file_as: str
    per_runtime: PerRuntimeEntryDict
