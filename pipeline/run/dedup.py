"""Variants whose artifacts are the same file: measured once, and said to be the same file.

Two variants may resolve to the same bytes (``int8`` and ``int8-rt@ort`` where placement is the same, or
``int8@ort`` and ``int8@openvino`` where per_runtime auto found that the placements agree).  Timing
the one file twice reports two latencies for one model, and the noise between the runs reads as a speedup.  After
the build, each variant whose model and external data hash the same as an earlier variant's is recorded as
``same_file_as`` that variant (its artifacts row in report.json and its sidecar); validation and benchmarks run the
file once, and the twin's rows are copies of the original's, marked, so that gates naming the twin still evaluate.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Final

from qdeploy.core.context import Artifact
from qdeploy.core.files import sha256_file, write_json_synced
from qdeploy.core.runtimes import runtime_of_variant
from qdeploy.core.tolerance import Tolerance
from qdeploy.pipeline.publish.published import ARTIFACTS, write_checksums
from qdeploy.pipeline.run.published_rows import PublishedArtifactRow

__all__ = ["SAME_FILE_KEY", "evaluate_once", "mark_same_files", "same_file_note", "with_twins"]

SAME_FILE_KEY: Final = "same_file_as"
"""Key of a twin's artifacts row and sidecar: the variant whose file it is."""


def same_file_note(original: str) -> str:
    return f"same file as {original} (same sha256): measured once, these are {original}'s numbers"


def mark_same_files(published: list[PublishedArtifactRow], generation: Path, reference: str) -> dict[str, str]:
    """Twin variant -> the variant whose file it is; adds ``same_file_as`` to each twin's row and sidecar.

    The reference variant is never a twin (validation needs its own outputs): a file it shares makes it the
    original.
    """
    first: dict[tuple[str, tuple[str, ...]], str] = {}
    same: dict[str, str] = {}
    for row in sorted(published, key=lambda row: row["name"] != reference):  # stable: the reference first
        identity = (row["sha256"], tuple(sorted(item["sha256"] for item in row.get("external_data") or [])))
        original = first.setdefault(identity, row["name"])
        if original != row["name"]:
            same[row["name"]] = original
            row[SAME_FILE_KEY] = original
            _mark_sidecar(row, generation / ARTIFACTS / f"{row['name']}.json", original)
    if same:
        write_checksums(generation)  # the twins' sidecars changed: SHA256SUMS lists sidecars too
    return same


def _mark_sidecar(row: PublishedArtifactRow, sidecar: Path, original: str) -> None:
    """The published sidecar says which variant's file it is (temporary name, then rename); the row keeps the
    sidecar's new hash where it records one."""
    if not sidecar.is_file():
        return
    meta = json.loads(sidecar.read_text())
    meta[SAME_FILE_KEY] = original
    temporary = sidecar.with_name(f".tmp-{sidecar.name}")
    write_json_synced(temporary, meta)
    os.replace(temporary, sidecar)
    if "sidecar_sha256" in row:
        row["sidecar_sha256"] = sha256_file(sidecar)


def evaluate_once(same: dict[str, str], artifacts: dict[str, Artifact], evaluate: Callable[[dict[str, Artifact]],
                  list[Any]], declared: dict[str, Tolerance] | None = None) -> list[Any]:
    """``evaluate`` over the artifacts less the twins whose original is evaluated too; the twins' rows are copies.

    A twin held to another declared tolerance than its original is validated itself: the same outputs may pass
    one limit and fail the other.  So is a twin built for another runtime than its original (``int8@openvino``,
    the file of ``int8@ort`` where per_runtime's placements agree): the original's rows are on other targets.
    """
    declared = declared or {}
    twins = {twin: original for twin, original in same.items()
             if twin in artifacts and original in artifacts and declared.get(twin) == declared.get(original)
             and runtime_of_variant(twin) == runtime_of_variant(original)}
    rows = evaluate({name: artifact for name, artifact in artifacts.items() if name not in twins})
    return with_twins(rows, twins)


def with_twins(rows: list[Any], twins: dict[str, str]) -> list[Any]:
    """``rows`` with, after each row of an original, a copy for each of its twins that says so."""
    return [copy for row in rows for copy in _row_and_copies(row, twins)]


def _row_and_copies(row: Any, twins: dict[str, str]) -> Iterator[Any]:
    yield row
    for twin, original in twins.items():
        if getattr(row, "variant", None) != original:
            continue
        note = same_file_note(original)
        if hasattr(row, "notes"):  # benchmark and throughput rows
            yield row.replace(variant=twin, notes=[*row.notes, note])
        else:  # validation rows
            yield row.replace(variant=twin, warnings=[*row.warnings, note])
