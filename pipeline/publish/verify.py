"""One chain of hashes from a run to what is read from it: report.json -> artifacts/ -> SHA256SUMS -> recipe.

``report.json`` records the sha256 of every published model, external data file and sidecar
(``artifacts[].sha256``, ``external_data[].sha256``, ``sidecar_sha256``) and a short hash of each section of the
recipe (``recipe.sections``); ``artifacts/SHA256SUMS`` lists the same files; ``recipe.snapshot.json`` beside the
report is the recipe as validated.  ``verify_published`` checks all three against the files before anything is
read from the run (``qdeploy package``, ``qdeploy.open_run``, ``qdeploy compare``).  What it cannot prove: a
person who rewrites report.json, the files and SHA256SUMS consistently is not caught (nothing is signed).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from qdeploy.core.errors import QdeployInputError
from qdeploy.core.files import sha256_file
from qdeploy.core.report import Report, as_report
from qdeploy.pipeline.publish.package.check import outside
from qdeploy.pipeline.publish.published import ARTIFACTS, CHECKSUMS, RECIPE_SNAPSHOT
from qdeploy.pipeline.results.identity import RECIPE_SECTIONS

__all__ = ["recipe_snapshot", "verify_published"]

AGAIN = "run the recipe again (qdeploy run) to publish a consistent set"


def verify_published(run: Path, report: Report | Mapping[str, Any] | None = None, *,
                     require_artifacts: bool = True) -> Report:
    """The run's report once every file it names has the sha256 it records and SHA256SUMS agrees.

    ``run``: the run folder or its report.json; ``report``: that file already parsed (else it is read here).
    A missing or changed file raises QdeployInputError naming it (exit 2).  ``require_artifacts=False`` (for
    ``compare``, which reads only numbers) accepts a report.json that stands alone, with no artifacts/ beside it.
    Reports of an older qdeploy record no ``sidecar_sha256``: their sidecars are checked against SHA256SUMS
    where it lists them, and not at all where it does not.
    """
    report_path = run / "report.json" if run.is_dir() else run
    report = as_report(_read_json(report_path, "report.json") if report is None else report, str(report_path))
    folder = report_path.parent / ARTIFACTS
    recorded = _recorded(report)
    if not folder.is_dir():
        if recorded and require_artifacts:
            raise QdeployInputError(f"{folder}: missing, and {report_path} names {len(recorded)} published files "
                                    f"there; give the whole run folder, or {AGAIN}")
        return report
    digests: dict[str, str] = {}
    problems = _against_report(folder, recorded, digests)
    problems += _against_checksums(folder, recorded, digests)
    problems += _snapshot_problems(report_path, report)
    if problems:
        raise QdeployInputError(f"{report_path.parent}: {'; '.join(problems)}: the published files are not the "
                                f"ones this run wrote; {AGAIN}")
    return report


def _read_json(path: Path, what: str) -> Any:
    if not path.is_file():
        raise QdeployInputError(f"{path}: no {what} there; give a run folder (qdeploy run --out DIR)")
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise QdeployInputError(f"{path}: not a readable {what}: {exc}; {AGAIN}") from None


def _recorded(report: Report) -> dict[str, str]:
    """File name under artifacts/ -> the sha256 report.json records for it."""
    recorded: dict[str, str] = {}
    for row in report.artifacts:
        recorded[Path(row.path).name] = row.sha256
        if row.sidecar_sha256 and row.sidecar:
            recorded[Path(row.sidecar).name] = row.sidecar_sha256
        for data in row.external_data:
            recorded[data.file] = data.sha256
    return recorded


def _digest(folder: Path, name: str, digests: dict[str, str]) -> str | None:
    """sha256 of artifacts/<name> (each file hashed once); None when it is missing or not a plain file inside."""
    if name not in digests:
        path = folder / name
        if outside(folder, name) or not path.is_file():
            return None
        digests[name] = sha256_file(path)
    return digests[name]


def _against_report(folder: Path, recorded: dict[str, str], digests: dict[str, str]) -> list[str]:
    problems = []
    for name, expected in recorded.items():
        found = _digest(folder, name, digests)
        if found is None:
            problems.append(f"artifacts/{name} is missing")
        elif found != expected:
            problems.append(f"artifacts/{name} changed since the run (sha256 {found[:12]}…, report.json records "
                            f"{str(expected)[:12]}…)")
    return problems


def _against_checksums(folder: Path, recorded: dict[str, str], digests: dict[str, str]) -> list[str]:
    """SHA256SUMS must list what report.json records with the same hashes, and its other lines must hold (an
    older run's SHA256SUMS lists no sidecars, and its report records no sidecar hash: neither is asked for)."""
    sums = folder / CHECKSUMS
    if not sums.is_file():
        return [f"artifacts/{CHECKSUMS} is missing"] if recorded else []
    listed = {}
    for line in sums.read_text(errors="replace").splitlines():
        digest, _, name = line.partition("  ")
        listed[name] = digest
    problems = []
    for name, expected in recorded.items():
        if listed.get(name) != expected:
            problems.append(f"artifacts/{CHECKSUMS} " + ("does not list " if name not in listed else
                                                          "records another sha256 than report.json for ") + name)
    for name, digest in listed.items():
        if name not in recorded and _digest(folder, name, digests) != digest:
            problems.append(f"artifacts/{name} is missing or differs from {CHECKSUMS}")
    return problems


def _snapshot_problems(report_path: Path, report: Report) -> list[str]:
    try:
        recipe_snapshot(report_path, report)
    except QdeployInputError as exc:
        return [str(exc)]
    return []


def recipe_snapshot(report_path: Path, report: Report) -> dict[str, Any] | None:
    """The run's recipe as validated (``recipe.snapshot.json`` beside its report), once each of its sections
    hashes to what report.json records; None for a run of an older qdeploy that stored none."""
    path = next((p for p in (report_path.parent / RECIPE_SNAPSHOT, report_path.resolve().parent / RECIPE_SNAPSHOT)
                 if p.is_file()), None)
    if path is None:
        return None
    snapshot = _read_json(path, RECIPE_SNAPSHOT)
    sections = report.recipe.sections
    if not isinstance(snapshot, dict) or not sections:
        raise QdeployInputError(f"{path}: not the recipe report.json records (no section hashes to compare)")
    changed = [name for name in RECIPE_SECTIONS if section_hash(snapshot.get(name)) != sections.get(name)]
    if changed:
        raise QdeployInputError(f"{path}: section {', '.join(changed)} differs from the hash report.json records "
                                "(recipe.sections): the recipe snapshot or report.json was edited")
    return snapshot


def section_hash(value: Any) -> str:
    """The short hash report.json records per recipe section (``identity.recipe_fingerprint``)."""
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:16]
