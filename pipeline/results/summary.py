"""The run summarised as report.json: what was built, validated and timed, the gates, the verdict, the environment.

``build_report`` builds the typed ``qdeploy.core.report.Report`` once; the report package
(``qdeploy.pipeline.report``) renders it and writes its JSON, the contract downstream jobs parse.
"""

from __future__ import annotations

import time
from typing import TypedDict

from qdeploy.core.report import REPORT_SCHEMA_VERSION, Report
from qdeploy.core.report_parts import RecipeRecord, Reference
from qdeploy.core.rows import (
    BenchmarkRow,
    BuildFailure,
    GateResult,
    ThroughputRow,
    UnmeasuredEntry,
    ValidationRow,
)
from qdeploy.core.runtimes import device_default_name
from qdeploy.pipeline.recipe.schema import Recipe
from qdeploy.pipeline.report.decode import with_decode_speedup
from qdeploy.pipeline.report.throughput import throughput_speedup
from qdeploy.pipeline.report.verdict import compute_verdict
from qdeploy.pipeline.results.envinfo import environment
from qdeploy.pipeline.results.gates import find_benchmark, round_ratios, run_passes, speedup
from qdeploy.pipeline.results.identity import ModelIdentityDict, recipe_content, recipe_fingerprint
from qdeploy.pipeline.run.published_rows import PublishedArtifactRow
from qdeploy.stages.validate import noise_floor_summary, unreadable_targets
from qdeploy.stages.validate.config import REFERENCE_TARGET

__all__ = ["REPORT_SCHEMA_VERSION", "DefaultSpeedupDict", "build_report", "speedup_range"]


class DefaultSpeedupDict(TypedDict):
    """A benchmark row's speedup against the reference at the device's default precision (None: no such row)."""

    speedup_vs_default: float | None
    speedup_vs_default_range: list[float] | None


def build_report(recipe: Recipe, artifacts: list[PublishedArtifactRow], validation: list[ValidationRow],
                 benchmarks: list[BenchmarkRow], gates: list[GateResult], failures: list[BuildFailure],
                 *, seconds: float, unmeasured: list[UnmeasuredEntry] | None = None,
                 model: ModelIdentityDict | None = None,
                 throughput: list[ThroughputRow] | None = None) -> Report:
    """The report (docs/report.md); ``to_json()`` gives report.json.

    ``artifacts``: the published artifacts' rows (``qdeploy.core.report_parts.ArtifactRecord`` as JSON);
    ``unmeasured``: what the recipe asked to measure and could not be (``qdeploy.pipeline.results.gates.unmeasured``);
    ``model``: the exported model's identity and signature, so runs of different models can be told apart;
    ``throughput``: rows of the benchmark's throughput mode (many requests in flight), apart from the latency
    rows so that nothing that reads latency (gates, speedups, compare) mistakes one for the other.
    """
    reference = recipe.reference_variant
    timed = [row.replace(speedup=speedup(benchmarks, row.variant, row.target, row.batch_size, reference),
                         speedup_range=speedup_range(benchmarks, row, reference),
                         **_against_default(benchmarks, row, reference)) for row in benchmarks]
    timed = [with_decode_speedup(benchmarks, row, reference) for row in timed]  # decode records only
    rates = []
    for row in throughput or []:
        ratio, spread = throughput_speedup(throughput or [], row, reference)
        rates.append(row.replace(speedup=ratio, speedup_range=spread))
    report = Report.model_validate({
        "schema_version": REPORT_SCHEMA_VERSION,
        "recipe": RecipeRecord(name=recipe.name, path=str(recipe.source) if recipe.source else None,
                               sections=recipe_fingerprint(recipe), content=recipe_content(recipe)),
        "model": model,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "seconds": seconds,
        "environment": environment(),
        "reference": Reference(variant=reference, target=REFERENCE_TARGET),
        "passed": run_passes(gates, validation, failures, unmeasured or []),
        "gates": gates,
        "failures": failures,
        "unmeasured": unmeasured or [],
        "artifacts": artifacts,
        "validation": validation,
        "noise_floor": noise_floor_summary(validation),
        "unreadable_targets": unreadable_targets(validation),
        "benchmarks": timed,
        "throughput": rates,
    })
    return report.replace(verdict=compute_verdict(report, tie_break=recipe.report.tie_break))


def _against_default(benchmarks: list[BenchmarkRow], row: BenchmarkRow, reference: str) -> DefaultSpeedupDict:
    """Speedup against the reference at the device's default precision, on targets that have that row."""
    default = device_default_name(reference)
    if find_benchmark(benchmarks, default, row.target, row.batch_size) is None:
        return {"speedup_vs_default": None, "speedup_vs_default_range": None}  # written as null: the key is known
    return {"speedup_vs_default": speedup(benchmarks, row.variant, row.target, row.batch_size, default),
            "speedup_vs_default_range": speedup_range(benchmarks, row, default)}


def speedup_range(benchmarks: list[BenchmarkRow], row: BenchmarkRow, reference: str) -> list[float] | None:
    """[lowest, highest] of the per-round speedups against the reference on the same target and batch.

    When the range holds 1.0 the rounds disagree on which of the two is faster.
    """
    ref = find_benchmark(benchmarks, reference, row.target, row.batch_size)
    if ref is None or row.status != "ok" or ref.status != "ok":
        return None
    ratios = round_ratios(ref, row)
    if not ratios and ref.round_group != row.round_group:  # timed in different rounds: their intervals bound it
        low, high = _interval(ref), _interval(row)
        return [low[0] / high[1], low[1] / high[0]] if low and high and high[0] > 0 and high[1] > 0 else None
    return [min(ratios), max(ratios)] if ratios else None


def _interval(row: BenchmarkRow) -> list[float] | None:
    bounds = row.latency_ms.ci95_p50 if row.latency_ms is not None else None
    return list(bounds) if bounds and len(bounds) == 2 else None
