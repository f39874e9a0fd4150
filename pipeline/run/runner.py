"""Run a recipe: transforms through the cache, then validation and benchmarks over the matrix, then the report.

The runner knows stages only through the registry.  A transform's cache key is
the hash of its input artifact's bytes, the stage's name and config, the
versions of the libraries it uses and the datasets it reads; an unchanged
chain prefix is computed once and reused by every variant that shares it.

A run is four phases that a scheduler (``qdeploy.pipeline.sweep.executors``) may drive one by
one, in other processes or on other machines: ``build_phase`` (export, variant
transforms, published artifacts), ``validate_phase``, ``benchmark_phase`` and
``finish_run`` (gates and reports).  What passes between them (``RunPlan``,
``BuildOutcome``, result rows) is plain data that pickles.  ``run_recipe`` runs
them in order in this process.
"""

from __future__ import annotations

import dataclasses
import fcntl
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from qdeploy.core.context import Artifact, StageContext, StageResult
from qdeploy.core.errors import QdeployError, QdeployInputError, RunLockedError, StageError
from qdeploy.core.report import Report
from qdeploy.core.report_parts import Packages
from qdeploy.core.rows import BenchmarkRow, BuildFailure, GateResult, ThroughputRow, UnmeasuredEntry, ValidationRow
from qdeploy.core.runtimes import phase_order, runtime_groups
from qdeploy.pipeline.publish.package.publish import write_run_packages
from qdeploy.pipeline.publish.published import (
    begin_generation,
    commit_generation,
    discard_generation,
    publish_artifact,
    stable_path,
    write_checksums,
)
from qdeploy.pipeline.publish.store import ArtifactStore, cache_key, library_versions, sha256_file
from qdeploy.pipeline.recipe.schema import EXPORTED, Recipe, VariantStep, registry
from qdeploy.pipeline.recipe.selection import selected_targets, selected_variants
from qdeploy.pipeline.report import write_reports
from qdeploy.pipeline.results.identity import code_fingerprint, comparison_facts, dataset_fingerprint, model_identity
from qdeploy.pipeline.results.layers import add_layers
from qdeploy.pipeline.run.dedup import evaluate_once, mark_same_files
from qdeploy.pipeline.run.device_default import with_setting_rows
from qdeploy.pipeline.run.guard import guard_artifact
from qdeploy.pipeline.run.large_results import spill_large_result
from qdeploy.pipeline.run.memory_plan import check_recipe_fits
from qdeploy.pipeline.run.per_runtime import PerRuntimeDecision, Placement, build_config, note_runtime_builds
from qdeploy.pipeline.run.plan import variants_with_reference
from qdeploy.pipeline.run.progress import Progress
from qdeploy.pipeline.run.published_rows import LineageStepDict, PublishedArtifactRow
from qdeploy.pipeline.run.residency import between_phases, session_budget
from qdeploy.stages.benchmark import shipped_precisions, split_modes, unmeasured_throughput
from qdeploy.stages.export import source_files
from qdeploy.stages.validate import check_output_names

__all__ = ["BuildOutcome", "RunOptions", "RunOutcome", "RunPlan", "benchmark_phase", "build_phase", "default_out_dir",
           "finish_run", "locked_out_dir", "plan_run", "progress_total", "run_recipe", "validate_phase"]

log = logging.getLogger(__name__)


@dataclass
class RunOptions:
    """How to run a recipe (the CLI's flags)."""

    out_dir: Path | None = None
    cache_dir: Path | None = None
    use_cache: bool = True
    variants: list[str] | None = None
    targets: list[str] | None = None
    show_progress: bool = True


@dataclass
class RunOutcome:
    """The report and the exit status it implies."""

    report: dict[str, Any]
    out_dir: Path
    exit_code: int


@dataclass
class RunPlan:
    """One run of a recipe, resolved: what to build and evaluate, and where. Pickles, so phases can run elsewhere."""

    recipe: Recipe
    variants: list[str]
    targets: list[str]
    out_dir: Path
    cache_dir: Path
    use_cache: bool = True


@dataclass
class BuildOutcome:
    """What the build phase produced; pickles, so the evaluation phases can run in another process."""

    exported: Artifact
    artifacts: dict[str, Artifact]
    """Final artifact of each variant that was built."""
    built: dict[str, Artifact]
    """Every artifact of this run by cache key (lineage walks it)."""
    failures: list[BuildFailure]
    input_error: bool
    published: list[PublishedArtifactRow]
    """The report's artifact rows."""
    evaluated: dict[str, Artifact]
    """Artifacts that validation and benchmarks cover: the reference first, then the selected variants."""
    generation: Path | None = None
    """The unpublished folder holding this run's artifacts; ``finish_run`` adds the reports and switches to it."""
    same_file: dict[str, str] = field(default_factory=dict)
    """Variant -> the earlier variant whose file it is (same sha256): evaluated once (``pipeline/run/dedup.py``)."""
    per_runtime: dict[str, PerRuntimeDecision] = field(default_factory=dict)
    """Variant as written -> what ``per_runtime: auto`` made of it (``pipeline/run/per_runtime.py``)."""


@dataclass
class _RunState:
    recipe: Recipe
    store: ArtifactStore
    use_cache: bool
    progress: Progress
    work_root: Path
    artifacts: dict[str, Artifact] = field(default_factory=dict)
    """Final artifact of each variant that was built."""
    failures: list[BuildFailure] = field(default_factory=list)
    built: dict[str, Artifact] = field(default_factory=dict)
    """Every artifact of this run by cache key, so a shared prefix is taken once."""
    input_error: bool = False
    cache_notes: dict[str, str] = field(default_factory=dict)
    """Cache key -> how this run got it: 'hit', 'built' or 'rebuilt: evicted (why the entry was damaged)'."""
    placements: dict[str, Placement] = field(default_factory=dict)
    """per_runtime auto: variant as written -> what its runtimes' placements showed (never kept on the recipe)."""


def default_out_dir(recipe: Recipe) -> Path:
    return Path("runs") / recipe.name


def run_recipe(recipe: Recipe, options: RunOptions | None = None) -> RunOutcome:
    """Run a whole recipe and write its report; never raises for a stage failure of one variant."""
    options = options or RunOptions()
    plan = plan_run(recipe, options)
    started = time.perf_counter()
    with locked_out_dir(plan.out_dir):
        ArtifactStore(plan.cache_dir).sweep_temporaries()
        with Progress(progress_total(plan), enabled=options.show_progress) as progress:
            outcome = build_phase(plan, progress)
            validation = validate_phase(plan, outcome, progress=progress)
            benchmarks = benchmark_phase(plan, outcome, progress=progress, validation=validation) \
                if recipe.benchmark.enabled else []
        return finish_run(plan, outcome, validation, benchmarks, seconds=time.perf_counter() - started)


def plan_run(recipe: Recipe, options: RunOptions) -> RunPlan:
    """Check the --variant/--target selection and resolve the folders; creates the output folder."""
    out_dir = (options.out_dir or default_out_dir(recipe)).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    return RunPlan(recipe=recipe, variants=variants_with_reference(recipe, selected_variants(recipe, options.variants)),
                   targets=selected_targets(recipe, options.targets), out_dir=out_dir,
                   cache_dir=(options.cache_dir or out_dir / "cache").resolve(), use_cache=options.use_cache)


def progress_total(plan: RunPlan) -> int:
    """Units of work of a whole run: the export, each transform step, validation and benchmarks."""
    return 1 + sum(len(plan.recipe.variants[v]) for v in plan.variants) + 2


def build_phase(plan: RunPlan, progress: Progress | None = None) -> BuildOutcome:
    """Export and every selected variant's transforms, through the cache; publish the artifacts.

    A variant's failure is recorded in the outcome; a failed export (every variant starts from it) raises.
    The artifacts go to a new generation of the published folder that stays invisible until ``finish_run``.
    """
    check_recipe_fits(plan.recipe, plan.variants)  # before anything is written: refuse what cannot fit
    generation = begin_generation(plan.out_dir)
    try:
        with tempfile.TemporaryDirectory(prefix="qdeploy-") as work:
            state = _RunState(plan.recipe, ArtifactStore(plan.cache_dir), plan.use_cache, progress or _silent(),
                              Path(work))
            exported = _build_export(state)
            for variant in plan.variants:
                _build_variant(state, variant, exported)
            published = _publish(state, plan.out_dir, generation)
            same_file = mark_same_files(published, generation, plan.recipe.reference_variant)
            per_runtime = note_runtime_builds(published, state.placements)
            evaluated = with_setting_rows(_evaluation_set(state, plan.variants, exported),
                                          plan.recipe.reference_variant, plan.targets, plan.recipe.benchmark)
    except BaseException:
        discard_generation(generation)
        raise
    return BuildOutcome(exported=exported, artifacts=state.artifacts, built=state.built, failures=state.failures,
                        input_error=state.input_error, published=published, evaluated=evaluated,
                        generation=generation, same_file=same_file, per_runtime=per_runtime)


def validate_phase(plan: RunPlan, outcome: BuildOutcome, targets: list[str] | None = None,
                   progress: Progress | None = None) -> list[ValidationRow]:
    """Validation rows of the evaluated artifacts on ``targets`` (default: the plan's)."""
    return _evaluate_phase(plan, outcome, "validate", targets, progress)


def benchmark_phase(plan: RunPlan, outcome: BuildOutcome, targets: list[str] | None = None,
                    progress: Progress | None = None,
                    validation: list[ValidationRow] | None = None) -> list[BenchmarkRow | ThroughputRow]:
    """Benchmark rows of the evaluated artifacts on ``targets`` (default: the plan's); give it the machine alone.
    With ``validation``, a pair validation ships at a pinned precision is timed at that precision."""
    return _evaluate_phase(plan, outcome, "benchmark", targets, progress,
                           {**({"shipped": shipped_precisions(validation)} if validation else {}),
                            "session_budget": session_budget(outcome.evaluated)})


def finish_run(plan: RunPlan, outcome: BuildOutcome, validation: list[ValidationRow],
               benchmarks: list[BenchmarkRow | ThroughputRow], *, seconds: float) -> RunOutcome:
    """Gates, the reports, and the exit status they imply; publishes artifacts and reports in one switch."""
    # lazy: pulls onnxruntime (import cost)
    from qdeploy.pipeline.results.gates import evaluate_gates, excuse_unreadable, unmeasured
    from qdeploy.pipeline.results.summary import build_report

    recipe = plan.recipe
    benchmarks, throughput = split_modes(benchmarks)
    sizes = {row["name"]: row["size_bytes"] for row in outcome.published}
    gates = evaluate_gates(recipe.gates, validation, benchmarks, recipe.reference_variant, outcome.failures, sizes,
                           selected=(plan.variants, plan.targets), throughput=throughput)
    missing = unmeasured(validation, benchmarks, _expected(plan, outcome, "latency"),
                         allowed=recipe.report.allow_unmeasured)
    missing += unmeasured_throughput(throughput, _expected(plan, outcome, "throughput"),
                                     allowed=recipe.report.allow_unmeasured)
    missing = excuse_unreadable(missing, validation)
    report = build_report(recipe, outcome.published, validation, benchmarks, gates, outcome.failures,
                          seconds=seconds, unmeasured=missing, model=model_identity(outcome.exported),
                          throughput=throughput)
    report = add_layers(report, recipe, outcome.evaluated, plan.targets)  # after the timed benchmark, not inside it
    generation = outcome.generation or begin_generation(plan.out_dir)
    try:
        report = report.replace(packages=_write_packages(plan, outcome, report, generation))
        write_reports(report, generation, recipe.report.formats)
        commit_generation(plan.out_dir, generation)
    except BaseException:
        discard_generation(generation)
        raise
    return RunOutcome(report=report.to_json(), out_dir=plan.out_dir,
                      exit_code=_exit_code(outcome, gates, validation, missing))


def _expected(plan: RunPlan, outcome: BuildOutcome, mode: str) -> tuple[list[str], list[str], list[int]]:
    """What the recipe asked to measure in one benchmark mode: (variants, targets, batch sizes)."""
    config = plan.recipe.benchmark
    wanted = config.enabled and config.mode in (mode, "both")
    return list(outcome.evaluated), plan.targets, config.batch_sizes if wanted else []


def _write_packages(plan: RunPlan, outcome: BuildOutcome, report: Report, generation: Path) -> Packages:
    return write_run_packages(report, plan.recipe, outcome.evaluated, generation, plan.targets, plan.out_dir)


def _silent() -> Progress:
    return Progress(0, enabled=False)


def _evaluate_phase(plan: RunPlan, outcome: BuildOutcome, stage: str, targets: list[str] | None,
                    progress: Progress | None, extra: dict[str, Any] | None = None) -> list[Any]:
    chosen = [target for target in plan.targets if targets is None or target in targets]
    between_phases(outcome.evaluated)  # what the build or the last phase freed goes back before sessions load
    with tempfile.TemporaryDirectory(prefix="qdeploy-") as work:
        state = _RunState(plan.recipe, ArtifactStore(plan.cache_dir), plan.use_cache, progress or _silent(),
                          Path(work))
        declared = plan.recipe.declared_tolerances() if stage == "validate" else None
        return evaluate_once(outcome.same_file, outcome.evaluated,
                             lambda artifacts: _evaluate(state, stage, artifacts, chosen, extra), declared)


def _exit_code(outcome: BuildOutcome, gates: list[GateResult], validation: list[ValidationRow],
               missing: list[UnmeasuredEntry]) -> int:
    """2 for bad input; 1 when a variant failed to build, a gate failed, a validation failed, or a measurement
    the recipe asked for could not be made (unless the recipe allows that)."""
    # lazy: pulls onnxruntime (import cost)
    from qdeploy.pipeline.results.gates import run_passes

    if outcome.input_error:
        return 2
    return 0 if run_passes(gates, validation, outcome.failures, missing) else 1


@contextmanager
def locked_out_dir(out_dir: Path) -> Iterator[None]:
    """Hold the output folder; a second run into it at the same time is refused clearly."""
    lock_path = out_dir / ".qdeploy.lock"
    with lock_path.open("a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise RunLockedError(f"{out_dir} is in use by another qdeploy run; wait for it to finish "
                                 "or choose another folder with --out") from None
        handle.seek(0)
        handle.truncate()
        handle.write(f"{os.getpid()}\n")
        handle.flush()
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _build_export(state: _RunState) -> Artifact:
    """The exported model; a failure here is the whole run's (every variant starts from it)."""
    info = registry.stage("export")
    config = state.recipe.model
    ctx = _context(state, EXPORTED, "export")
    versions = library_versions(("qdeploy", *registry.export_libraries(config)))
    key = cache_key({
        "stage": "export", "config": config.model_dump(mode="json"), "versions": versions,
        "sources": {str(path.name): sha256_file(path) for path in source_files(config, ctx)},
    })
    state.progress.phase("export")
    artifact = _transform(state, key, info, None, config, ctx, versions, stages=("export",))
    check_output_names(state.recipe.validate_, artifact.path)  # before any variant is built on a misspelt name
    if not artifact.cached:  # a large model's freed memory back before the next stage (a hit freed nothing)
        between_phases({EXPORTED: artifact})
    state.progress.done()
    return artifact


def _build_variant(state: _RunState, variant: str, exported: Artifact) -> None:
    artifact = exported
    for index, step in enumerate(state.recipe.variants[variant]):
        state.progress.phase(f"{step.stage} · {variant}")
        try:
            artifact = _build_step(state, variant, step, artifact)
        except QdeployError as exc:
            _record_failure(state, variant, step.stage, exc)
            for _ in state.recipe.variants[variant][index:]:
                state.progress.done()
            return
        except Exception as exc:  # a bug or a library failing on this model must not lose the other variants
            log.debug("stage %s of %s failed", step.stage, variant, exc_info=True)
            _record_failure(state, variant, step.stage, StageError(step.stage, variant, f"{type(exc).__name__}: {exc}"))
            for _ in state.recipe.variants[variant][index:]:
                state.progress.done()
            return
        if not artifact.cached:
            between_phases({EXPORTED: exported, variant: artifact})
        state.progress.done()
    state.artifacts[variant] = artifact


def _record_failure(state: _RunState, variant: str, stage: str, exc: QdeployError) -> None:
    reason = exc.reason if isinstance(exc, StageError) else str(exc)
    log.error("variant %s: stage %s failed: %s", variant, stage, reason)
    state.input_error |= isinstance(exc, QdeployInputError)
    state.failures.append(BuildFailure(variant=variant, stage=stage, reason=reason,
                                       kind="input" if isinstance(exc, QdeployInputError) else "stage"))


def _build_step(state: _RunState, variant: str, step: VariantStep, parent: Artifact) -> Artifact:
    info = registry.stage(step.stage)
    config = build_config(state, variant, step, parent)  # parsed once, by the recipe; per_runtime auto: per runtime
    versions = library_versions(("qdeploy", *info.libraries))
    datasets = info.datasets_used(config)
    default = state.recipe.validate_.data
    if default is not None and default not in datasets and info.reads_default_dataset(config):
        datasets.append(default)
    key = cache_key({  # the config as dumped from its model: the bytes the keys always hashed
        "stage": step.stage, "config": config.model_dump(mode="json"), "versions": versions,
        "parent_sha256": parent.sha256, "parent_external_data": [list(item) for item in parent.external_data],
        "data": dataset_fingerprint(state.recipe, datasets),
        **code_fingerprint(state.recipe, config), **info.host_facts(config),  # a metric file; AMX (ptq for ORT)
        **comparison_facts(state.recipe, info.uses_targets, info.true_fp16_checked),  # targets, detections
    })
    ctx = _context(state, variant, step.stage)
    return _transform(state, key, info, parent, config, ctx, versions, stages=(*parent.stages, step.stage))


def _transform(state: _RunState, key: str, info: registry.StageInfo, parent: Artifact | None, config: Any,
               ctx: StageContext, versions: dict[str, str], *, stages: tuple[str, ...]) -> Artifact:
    if key in state.built:
        return state.built[key]
    cached = state.store.get(key) if state.use_cache else None
    if cached is not None:
        log.info("%s of %s: cached (%s)", info.name, ctx.variant, key[:12])
        state.built[key] = cached
        state.cache_notes[key] = "hit"
        return cached
    started = time.perf_counter()
    ctx.work_dir.mkdir(parents=True, exist_ok=True)
    spill = state.work_root / f"spill-{key[:12]}"
    try:
        result: StageResult = info.function()(parent, config, ctx)
        result = spill_large_result(result, spill, f"{key[:16]}.weights")  # weights to disk: one copy, not two
        guard_artifact(parent, result, info.name, ctx)  # never store what ONNX Runtime cannot load
    finally:
        shutil.rmtree(ctx.work_dir, ignore_errors=True)
    seconds = time.perf_counter() - started
    meta = {
        "stage": info.name, "stages": list(stages), "parent": parent.key if parent else None,
        "parent_sha256": parent.sha256 if parent else None, "config": config.model_dump(mode="json"),
        "libraries": versions, "findings": result.report(), "changed": result.changed, "seconds": seconds,
        "first_built_for": ctx.variant,
    }
    try:
        stored = state.store.put(key, result.model, meta, saved=result.path)
    finally:
        shutil.rmtree(spill, ignore_errors=True)
    artifact = dataclasses.replace(stored, cached=False)
    state.built[key] = artifact
    evicted = state.store.evictions.get(key)
    state.cache_notes[key] = f"rebuilt: evicted ({evicted})" if evicted else "built"
    log.log(logging.WARNING if evicted else logging.INFO, "%s of %s: %s in %.2fs (%s)", info.name, ctx.variant,
            state.cache_notes[key], seconds, key[:12])
    return artifact


def _context(state: _RunState, variant: str, stage: str) -> StageContext:
    work = state.work_root / f"{variant}-{stage}"
    targets = state.recipe.validated_targets(true_fp16=registry.stage(stage).true_fp16_checked)
    shared = (state.store.root if state.use_cache else state.work_root) / "intermediate"
    return state.recipe.stage_context(variant, work, on_progress=state.progress.detail, targets=targets,
                                      cache_dir=shared)


def _publish(state: _RunState, out_dir: Path, generation: Path) -> list[PublishedArtifactRow]:
    """Copy each variant's artifact to artifacts/<variant>.onnx of the new generation; the report's artifact rows.

    Paths in the rows are where the files are seen once the generation is published (OUT/artifacts/...).
    """
    rows: list[PublishedArtifactRow] = []
    for name, artifact in state.artifacts.items():
        lineage = _lineage(state, artifact)
        path, sidecar, external = publish_artifact(artifact, generation, name, {"variant": name, "lineage": lineage})
        rows.append({
            "name": name, "path": str(stable_path(out_dir, generation, path)),
            "sidecar": str(stable_path(out_dir, generation, sidecar)), "sha256": artifact.sha256,
            "sidecar_sha256": sha256_file(sidecar),  # the published sidecar, as written: SHA256SUMS lists it too
            "external_data": external, "size_bytes": artifact.size_bytes, "parent": artifact.parent,
            "stages": list(artifact.stages), "cached": artifact.cached, "cache": _cache_note(state, artifact),
            "seconds": artifact.seconds, "key": artifact.key, "lineage": lineage,
        })
    write_checksums(generation)
    return rows


def _cache_note(state: _RunState, artifact: Artifact) -> str:
    """How this run got an artifact: 'hit', 'built', or 'rebuilt: evicted (reason)' for it or a step before it."""
    current: Artifact | None = artifact
    while current is not None:
        note = state.cache_notes.get(current.key, "hit")
        if note.startswith("rebuilt"):
            return note if current is artifact else f"{note} at step {current.stages[-1] if current.stages else '?'}"
        current = state.built.get(current.parent) if current.parent else None
    return state.cache_notes.get(artifact.key, "hit")


def _lineage(state: _RunState, artifact: Artifact) -> list[LineageStepDict]:
    """The chain from the exported model to this artifact: each step's key, stage, cache state and findings."""
    import json

    chain: list[LineageStepDict] = []
    current: Artifact | None = artifact
    while current is not None:
        meta = json.loads(current.sidecar.read_text())
        chain.append({"key": current.key, "stage": meta["stage"], "cached": current.cached,
                      "cache": state.cache_notes.get(current.key, "hit"), "seconds": current.seconds,
                      "config": meta.get("config"), "findings": meta.get("findings")})
        current = state.built.get(current.parent) if current.parent else None
    return chain[::-1]


def _evaluation_set(state: _RunState, variants: list[str], exported: Artifact) -> dict[str, Artifact]:
    evaluated = {name: state.artifacts[name] for name in variants if name in state.artifacts}
    reference = state.recipe.reference_variant
    if reference == EXPORTED:
        return {EXPORTED: exported, **evaluated}
    if reference not in state.artifacts:
        return evaluated  # its failure is recorded; the evaluations say the reference is missing
    return {reference: state.artifacts[reference], **evaluated}


def _evaluate(state: _RunState, stage: str, artifacts: dict[str, Artifact], targets: list[str],
              extra: dict[str, Any] | None = None) -> list[Any]:
    info = registry.stage(stage)
    config = state.recipe.validate_ if stage == "validate" else state.recipe.benchmark
    state.progress.phase(stage)
    ctx = _context(state, "*", stage)
    extra = {"declared": state.recipe.declared_tolerances()} if stage == "validate" else dict(extra or {})
    groups = runtime_groups(artifacts, targets)
    results = [row for chosen, group in groups for row in info.function()(group, chosen, config, ctx, **extra)]
    state.progress.done()
    batches = state.recipe.benchmark.batch_sizes
    return phase_order(results, list(artifacts), targets, batches) if len(groups) > 1 else results
