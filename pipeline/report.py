"""The run's report: report.json (the contract downstream jobs parse), report.md and report.html for people."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from pipeline.gates import find_benchmark, run_passes, speedup
from pipeline.recipe import Recipe
from pipeline.report_tables import matrix_lines, throughput_lines, tradeoff_lines, verdict_markdown
from pipeline.report_view import (
    benchmark_settings,
    fmt,
    gate_label,
    gate_verdict,
    highlights,
    lineage_chain,
    problems,
    unmeasured_lines,
    validation_notes,
)
from pipeline.store import write_json_atomic, write_text_atomic
from pipeline.throughput_report import throughput_speedup
from pipeline.verdict import verdict_section
from stages.validate import REFERENCE_TARGET

SCHEMA_VERSION = 2
"""2: `verdict` and `throughput` (issue 18)."""


def build_report(recipe: Recipe, artifacts: list[dict[str, Any]], validation: list[dict[str, Any]],
                 benchmarks: list[dict[str, Any]], gates: list[dict[str, Any]], failures: list[dict[str, Any]],
                 *, seconds: float, unmeasured: list[dict[str, Any]] | None = None,
                 model: dict[str, Any] | None = None,
                 throughput: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """The report as a JSON-serialisable dict (see the README's report contract).

    ``unmeasured``: what the recipe asked to measure and could not be (``pipeline.gates.unmeasured``);
    ``model``: the exported model's identity and signature, so runs of different models can be told apart;
    ``throughput``: rows of the benchmark's throughput mode (many requests in flight), apart from the latency
    rows so that nothing that reads latency (gates, speedups, compare) mistakes one for the other.
    """
    from pipeline.envinfo import environment
    from pipeline.report_identity import recipe_fingerprint
    from stages.validate_floor import noise_floor_summary

    reference = recipe.reference_variant
    for row in benchmarks:
        row["speedup"] = speedup(benchmarks, row["variant"], row["target"], row["batch_size"], reference)
        row["speedup_range"] = speedup_range(benchmarks, row, reference)
    for row in throughput or []:
        row["speedup"], row["speedup_range"] = throughput_speedup(throughput or [], row, reference)
    report = {
        "schema_version": SCHEMA_VERSION,
        "recipe": {"name": recipe.name, "path": str(recipe.source) if recipe.source else None,
                   "sections": recipe_fingerprint(recipe)},
        "model": model,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "seconds": seconds,
        "environment": environment(),
        "reference": {"variant": reference, "target": REFERENCE_TARGET},
        "passed": run_passes(gates, validation, failures, unmeasured or []),
        "gates": gates,
        "failures": failures,
        "unmeasured": unmeasured or [],
        "artifacts": artifacts,
        "validation": validation,
        "noise_floor": noise_floor_summary(validation),
        "benchmarks": benchmarks,
        "throughput": throughput or [],
    }
    report["verdict"] = verdict_section(report)
    return report


def speedup_range(benchmarks: list[dict[str, Any]], row: dict[str, Any], reference: str) -> list[float] | None:
    """[lowest, highest] of the per-round speedups against the reference on the same target and batch.

    When the range holds 1.0 the rounds disagree on which of the two is faster.
    """
    ref = find_benchmark(benchmarks, reference, row["target"], row["batch_size"])
    if ref is None or row.get("status") != "ok" or ref.get("status") != "ok":
        return None
    ratios = [r / v for r, v in zip(ref.get("round_p50_ms") or [], row.get("round_p50_ms") or [], strict=False)
              if v > 0]
    return [min(ratios), max(ratios)] if ratios else None


def write_reports(report: dict[str, Any], out_dir: Path, formats: list[str]) -> list[Path]:
    """Write the asked formats atomically; report.json is always written."""
    written = [out_dir / "report.json"]
    write_json_atomic(written[0], report)
    if "md" in formats:
        written.append(out_dir / "report.md")
        write_text_atomic(written[-1], render_markdown(report))
    if "html" in formats:
        from pipeline.report_html import render_html

        written.append(out_dir / "report.html")
        write_text_atomic(written[-1], render_html(report))
    return written


def _gate_rows(report: dict[str, Any]) -> list[str]:
    if not report["gates"]:
        return ["No gates in the recipe."]
    lines = ["| gate | value | verdict |", "|---|---|---|"]
    for gate in report["gates"]:
        verdict = gate_verdict(gate)
        shown = {"PASS": "PASS", "SKIP": "skipped", "FAIL": "**FAIL**"}[verdict]
        reason = f" {gate['reason']}" if gate.get("reason") else ""
        lines.append(f"| {gate_label(gate)} | {fmt(gate['value'], 4)} | {shown}{reason} |")
    return lines


def _artifact_lines(report: dict[str, Any]) -> list[str]:
    lines = []
    for artifact in report["artifacts"]:
        cache = f"; cache: {artifact['cache']}" if artifact.get("cache", "hit") not in ("hit", "built") else ""
        lines.append(f"- **{artifact['name']}**: {lineage_chain(artifact)}; sha256 `{artifact['sha256']}`, "
                     f"{artifact['size_bytes'] / 1e6:.2f} MB{cache}")
        lines += [f"  - external data `{data['file']}`: sha256 `{data['sha256']}`"
                  for data in artifact.get("external_data", [])]
        for step in artifact.get("lineage", []):
            lines += [f"  - {step['stage']}: {line}" for line in highlights(step.get("findings"))]
    return lines


def _validation_lines(report: dict[str, Any]) -> list[str]:
    lines = []
    for row in report["validation"]:
        lines += [f"- {row['variant']} on {row['target']}: {note}" for note in validation_notes(row)]
    lines = list(dict.fromkeys(lines))
    noise = report.get("noise_floor")
    if noise:
        lines.append(f"- noise floor of the reference: {_inline(noise)}")
    return lines


def _inline(value: Any) -> str:
    if isinstance(value, dict):
        return ", ".join(f"{key} {fmt(item, 4)}" for key, item in value.items())
    return fmt(value, 4)


def render_markdown(report: dict[str, Any]) -> str:
    env = report["environment"]
    verdict = "all gates hold" if report["passed"] else "**FAILED**"
    missing = unmeasured_lines(report)
    parts = [
        f"# qdeploy report: {report['recipe']['name']}",
        "",
        f"Verdict: {verdict}. Reference: `{report['reference']['variant']}` on `{report['reference']['target']}`. "
        f"Run took {report['seconds']:.1f} s.",
        *(["", *ship] if (ship := verdict_markdown(report)) else []),
        *(["", "## Asked for but not measured", "", *[f"- {line}" for line in missing]] if missing else []),
        "", "## Gates", "", *_gate_rows(report),
        "", "## Latency and accuracy", "", *matrix_lines(report),
        "", "Speedup is the reference's median latency over the variant's on the same target and batch, the median "
        "of the per-round ratios of interleaved rounds; `≈1x (low–high)` marks a speedup whose rounds disagree on "
        "which is faster. `(noisy)` marks a median whose 95% interval is wider than 10% of it. The serial rate is "
        "batch / p50 of one request at a time, not a throughput. Cosine, SNR and max abs err compare with the "
        "reference outputs on the same inputs.",
        *tradeoff_lines(report),
        *(["", *throughput_lines(report)] if report.get("throughput") else []),
    ]
    settings = benchmark_settings(report)
    if settings:
        parts += ["", "## How latency was measured", "", *[f"- {line}" for line in settings]]
    reasons = problems(report)
    notes = _validation_lines(report)
    if reasons or notes:
        parts += ["", "## Failures, unavailable targets and warnings", "", *[f"- {line}" for line in reasons],
                  *notes]
    parts += ["", "## Artifacts", "", *_artifact_lines(report)]
    cpu = env["cpu"]
    flags = ", ".join(flag for flag, present in cpu["flags"].items() if present) or "none"
    versions = ", ".join(f"{name} {version}" for name, version in env["versions"].items())
    parts += ["", "## Environment", "", f"- CPU: {cpu['model']} ({cpu['cores']} cores; {flags})",
              f"- Python {env['python']} on {env.get('platform', '?')}; {versions}",
              f"- Available targets: {', '.join(env['available_targets'])}", ""]
    return "\n".join(parts)
