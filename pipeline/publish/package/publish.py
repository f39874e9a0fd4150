"""Which packages a run writes, and packaging a finished run (``qdeploy package``).

``qdeploy run`` packages, per available target, the artifact the verdict picks there (``report['verdict']``);
a report without a verdict packages every artifact whose validation passed on that target.  The packages go
into the run's unpublished generation (``OUT/packages/`` once published), so they switch together with the
artifacts and reports they were made from.  ``qdeploy package RUN --target T`` packages a finished run again,
after checking its artifacts, sidecars and recipe snapshot against the hashes report.json and
``artifacts/SHA256SUMS`` record (``qdeploy.pipeline.publish.verify``); its tolerances are computed again from the
recipe.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from qdeploy.core.report import Report, as_report
from qdeploy.core.report_parts import Packages
from qdeploy.core.runtimes import artifact_of, built_for, variants_named
from qdeploy.pipeline.publish.package import (
    PackageError,
    PackageSource,
    build_package,
    packable,
    package_name,
    source_from_report,
)
from qdeploy.pipeline.publish.package.data import (
    CHECK_FILE,
    CheckData,
    compute_check_data,
    read_check_data,
    write_check_data,
)
from qdeploy.pipeline.publish.package.provenance import FROM_RECIPE, recipe_tolerances
from qdeploy.pipeline.publish.package.records import PackageRun
from qdeploy.pipeline.publish.published import write_recipe_snapshot
from qdeploy.pipeline.publish.store import sha256_file
from qdeploy.pipeline.publish.verify import recipe_snapshot, verify_published

if TYPE_CHECKING:
    from qdeploy.core.context import Artifact

log = logging.getLogger(__name__)

PACKAGES = "packages"


def chosen_pairs(report: Report | Mapping[str, Any], targets: list[str] | None = None,
                 which: str = "verdict") -> list[tuple[str, str]]:
    """(variant, target) to package: the verdict's pick per target (``which`` 'verdict', when the report has a
    verdict), else every passed validation row."""
    report = as_report(report)
    published = {row.name for row in report.artifacts}
    wanted = [t for t in (targets or _report_targets(report)) if packable(t)]
    if which == "verdict" and report.verdict is not None:
        return [(pick.variant, target) for target, pick in report.verdict.targets.items() if target in wanted
                and pick.variant is not None and artifact_of(pick.variant) in published]
    return [(row.variant, row.target) for row in report.validation
            if row.status == "passed" and row.target in wanted and artifact_of(row.variant) in published]


def _report_targets(report: Report) -> list[str]:
    return list(dict.fromkeys(row.target for row in report.validation))


def write_run_packages(report: Report, recipe: Any, evaluated: dict[str, Artifact], generation: Path,
                       targets: list[str], stable_root: Path) -> Packages:
    """Check data and the packages of a finished run into its generation; the report's 'packages' record.

    A package that fails its own check is not written and is listed under 'failed'; it never fails the run
    (gates decide that), but the report and the log say why.
    """
    snapshot = recipe.model_dump(mode="json", by_alias=True)
    write_recipe_snapshot(generation, snapshot)  # what `qdeploy package` later reads tolerances from
    spec = recipe.report.packages
    if not spec.enabled:
        return Packages(enabled=False, written=[], failed=[])

    artifacts = generation / "artifacts"
    check = compute_check_data(recipe, evaluated, spec.check_samples)
    (generation / PACKAGES).mkdir(exist_ok=True)
    write_check_data(generation / PACKAGES / CHECK_FILE, check)  # for `qdeploy package` later, hashed below
    written, failed = [], []
    for variant, target in chosen_pairs(report, targets, spec.which):
        try:
            model = artifacts / f"{artifact_of(variant)}.onnx"  # fp32@default: the fp32 file at another setting
            source = _traced(source_from_report(report, variant, target, model), snapshot,
                             {"folder": str(stable_root), "report_sha256": None, "why": RUN_TIME_PACKAGE})
            folder = build_package(source, generation / PACKAGES, check, ort_optimized=spec.ort_optimized)
        except Exception as exc:  # one package's failure must not lose the run's reports
            log.warning("no package for %s on %s: %s", variant, target, exc)
            failed.append({"variant": variant, "target": target, "reason": str(exc)})
            continue
        written.append({"variant": variant, "target": target,
                        "path": str(stable_root / PACKAGES / folder.name),
                        "manifest_sha256": sha256_file(folder / "manifest.json"),
                        "checked": bool(check.samples), "unchecked_reason": check.left_out or None})
    by_verdict = spec.which == "verdict" and report.verdict is not None and report.verdict.targets
    return Packages.model_validate({
        "enabled": True, "chosen_by": "verdict" if by_verdict else "every artifact that passed validation on the "
        "target", "written": written, "failed": failed, "check_samples": check.samples, "check_source": check.source,
        "check_data": {"file": f"{PACKAGES}/{CHECK_FILE}", "sha256": sha256_file(generation / PACKAGES / CHECK_FILE)}})


RUN_TIME_PACKAGE = ("made by the run itself, before its report.json existed: report.json's packages.written "
                    "records this manifest's sha256 instead")


def _traced(source: PackageSource, snapshot: dict[str, Any] | None, run: PackageRun) -> PackageSource:
    """The source with the run it comes from and its tolerances computed from the run's recipe (or, for a run
    that stored no recipe snapshot, report.json's, said so in the manifest)."""
    source.run = run
    if snapshot is not None:
        source.tolerances = recipe_tolerances(snapshot, source.validation, source.model_path)
        source.tolerances_from = FROM_RECIPE
    return source


def package_from_run(run_dir: Path, target: str, variants: list[str] | None, out_dir: Path, *,
                     ort_optimized: bool = False) -> list[Path]:
    """Package a finished run's artifacts for one target into out_dir; PackageError says what is wrong."""
    report_path = run_dir / "report.json" if run_dir.is_dir() else run_dir
    if not report_path.is_file():
        raise PackageError(f"{run_dir}: no report.json there; give the output folder of a qdeploy run",
                           input_error=True)
    label = str(report_path)
    try:
        data = report_path.read_bytes()
        parsed = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise PackageError(f"{label}: not a report qdeploy wrote ({exc}); run qdeploy run again",
                           input_error=True) from None
    if not isinstance(parsed, dict):
        raise PackageError(f"{label}: not a report qdeploy wrote (a JSON {type(parsed).__name__}, not an object)",
                           input_error=True)
    report = as_report(parsed, label)  # the whole report, parsed before any of it is used
    run: PackageRun = {"folder": str(report_path.parent.resolve()), "report": report_path.name,
                       "report_sha256": hashlib.sha256(data).hexdigest()}
    return _package_report(report, report_path, run, target, variants, out_dir, ort_optimized)


def _package_report(report: Report, report_path: Path, run: PackageRun, target: str,
                    variants: list[str] | None, out_dir: Path, ort_optimized: bool) -> list[Path]:
    run_dir = report_path.parent
    targets = _report_targets(report)
    if target not in targets:
        raise PackageError(f"--target {target}: the run validated {', '.join(targets) or 'no target'}",
                           input_error=True)
    verify_published(report_path, report)  # every file report.json names, as it records it, before any is read
    chosen = _builds_named(report, variants, target) if variants else [
        variant for variant, pair_target in chosen_pairs(report, [target])]
    if not chosen:
        raise PackageError(f"no artifact passed validation on {target} in {run_dir}; nothing to package",
                           input_error=True)
    check = stored_check_data(run_dir, report)
    snapshot = recipe_snapshot(report_path, report)
    if snapshot is None and any(row.sidecar_sha256 for row in report.artifacts):
        raise PackageError(f"{run_dir}: recipe.snapshot.json is missing; this qdeploy wrote the run with one and a "
                           "package's tolerances are read from it. Give the whole run folder, or run the recipe "
                           "again", input_error=True)
    models = run_dir / "artifacts"
    sources = [_traced(source_from_report(report, variant, target, models / f"{artifact_of(variant)}.onnx"),
                       snapshot, run) for variant in dict.fromkeys(chosen)]  # all refused before one is written
    return [build_package(source, out_dir, check, ort_optimized=ort_optimized) for source in sources]


def _builds_named(report: Report, variants: list[str], target: str) -> list[str]:
    """``--variant`` names: a variant per_runtime split (``int8``) names its build for ``target`` (``int8@ort``)."""
    names = [row.name for row in report.artifacts]
    return [next((build for build in variants_named(name, names) if built_for(build, target)), name)
            for name in variants]


def stored_check_data(run_dir: Path, report: Report | Mapping[str, Any]) -> CheckData:
    """The run's check data, verified against the sha256 its report records; 'unchecked' data when the run
    wrote none (packages off, or an older qdeploy)."""
    report = as_report(report)
    record = report.packages.check_data if report.packages else None
    if record is None:
        return CheckData(left_out="the run wrote no check data (packages were off, or an older qdeploy ran it)")
    path = run_dir / record.file
    if not path.is_file() or sha256_file(path) != record.sha256:
        raise PackageError(f"{path}: missing or changed since the run (its sha256 is in report.json); run qdeploy "
                           "run again", input_error=True)
    return read_check_data(path)


__all__ = ["chosen_pairs", "package_from_run", "package_name", "stored_check_data", "write_run_packages"]
