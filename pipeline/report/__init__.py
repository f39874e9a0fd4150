"""The run's report rendered: report.json as built (``qdeploy.pipeline.results.summary``), report.md and report.html for
people.  It reads the typed report (``qdeploy.core.report.Report``) only, never the recipe or the store."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from qdeploy.core.files import write_json_atomic, write_text_atomic
from qdeploy.core.report import Report, as_report
from qdeploy.pipeline.report.decode import decode_markdown
from qdeploy.pipeline.report.format import fmt_mb, fmt_number
from qdeploy.pipeline.report.html import render_html
from qdeploy.pipeline.report.layers import layer_markdown
from qdeploy.pipeline.report.sections import noise_floor_lines, package_lines
from qdeploy.pipeline.report.tables import matrix_lines, throughput_lines, tradeoff_lines, verdict_markdown
from qdeploy.pipeline.report.view import (
    benchmark_settings,
    gate_label,
    gate_verdict,
    highlights,
    lineage_chain,
    problems,
    unmeasured_lines,
    validation_notes,
)

__all__ = ["render_markdown", "write_reports"]


def write_reports(report: Report | Mapping[str, Any], out_dir: Path, formats: list[str]) -> list[Path]:
    """Write the asked formats atomically; report.json is always written."""
    report = as_report(report)
    written = [out_dir / "report.json"]
    write_json_atomic(written[0], report.to_json())
    if "md" in formats:
        written.append(out_dir / "report.md")
        write_text_atomic(written[-1], render_markdown(report))
    if "html" in formats:
        written.append(out_dir / "report.html")
        write_text_atomic(written[-1], render_html(report))
    return written


def _gate_rows(report: Report) -> list[str]:
    if not report.gates:
        return ["No gates in the recipe."]
    lines = ["| gate | value | verdict |", "|---|---|---|"]
    for gate in report.gates:
        verdict = gate_verdict(gate)
        shown = {"PASS": "PASS", "SKIP": "skipped", "FAIL": "**FAIL**"}[verdict]
        reason = f" {gate.reason}" if gate.reason else ""
        lines.append(f"| {gate_label(gate)} | {fmt_number(gate.value, 4, style='value')} | {shown}{reason} |")
    return lines


def _artifact_lines(report: Report) -> list[str]:
    lines = []
    for artifact in report.artifacts:
        cache = f"; cache: {artifact.cache}" if artifact.cache not in (None, "hit", "built") else ""
        lines.append(f"- **{artifact.name}**: {lineage_chain(artifact)}; sha256 `{artifact.sha256}`, "
                     f"{fmt_mb(artifact.size_bytes)}{cache}")
        lines += [f"  - external data `{data.file}`: sha256 `{data.sha256}`" for data in artifact.external_data]
        if artifact.per_runtime is not None:  # per_runtime auto: one graph for both runtimes, or one each, and why
            lines.append(f"  - per_runtime: {artifact.per_runtime.note}")
        for step in artifact.lineage:
            lines += [f"  - {step.stage}: {line}" for line in highlights(step.findings)]
    return lines


def _validation_lines(report: Report) -> list[str]:
    lines = []
    for row in report.validation:
        lines += [f"- {row.variant} on {row.target}: {note}" for note in validation_notes(row)]
    lines = list(dict.fromkeys(lines))
    return lines + [f"- {line}" for line in noise_floor_lines(report.noise_floor)]


def render_markdown(report: Report | Mapping[str, Any]) -> str:
    report = as_report(report)
    verdict = "all gates hold" if report.passed else "**FAILED**"
    missing = unmeasured_lines(report)
    parts = [
        f"# qdeploy report: {report.recipe.name}",
        "",
        f"Verdict: {verdict}. Reference: `{report.reference.variant}` on `{report.reference.target}`. "
        f"Run took {report.seconds:.1f} s.",
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
        *(["", *throughput_lines(report)] if report.throughput else []),
        *(["", *decode] if (decode := decode_markdown(report)) else []),
        *layer_markdown(report),
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
    if packaged := package_lines(report):
        parts += ["", "## Packages", "", *[f"- {line}" for line in packaged]]
    env = report.environment
    if env is None:
        return "\n".join([*parts, "", "## Environment", "", "- not recorded", ""])
    flags = ", ".join(flag for flag, present in env.cpu.flags.items() if present) or "none"
    versions = ", ".join(f"{name} {version}" for name, version in env.versions.items())
    parts += ["", "## Environment", "", f"- CPU: {env.cpu.model} ({env.cpu.cores} cores; {flags})",
              f"- Python {env.python} on {env.platform or '?'}; {versions}",
              f"- Available targets: {', '.join(env.available_targets)}", ""]
    return "\n".join(parts)
