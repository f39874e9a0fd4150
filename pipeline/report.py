"""The run's report: report.json (the contract downstream jobs parse) and report.md for people."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from pipeline.gates import gates_hold, speedup
from pipeline.recipe import Recipe
from pipeline.store import write_json_atomic, write_text_atomic
from stages.validate import REFERENCE_TARGET

SCHEMA_VERSION = 1


def build_report(recipe: Recipe, artifacts: list[dict[str, Any]], validation: list[dict[str, Any]],
                 benchmarks: list[dict[str, Any]], gates: list[dict[str, Any]], failures: list[dict[str, Any]],
                 *, seconds: float) -> dict[str, Any]:
    """The report as a JSON-serialisable dict (see the README's report contract)."""
    from pipeline.envinfo import environment

    reference = recipe.reference_variant
    for row in benchmarks:
        row["speedup"] = speedup(benchmarks, row["variant"], row["target"], row["batch_size"], reference)
    return {
        "schema_version": SCHEMA_VERSION,
        "recipe": {"name": recipe.name, "path": str(recipe.source) if recipe.source else None},
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "seconds": seconds,
        "environment": environment(),
        "reference": {"variant": reference, "target": REFERENCE_TARGET},
        "passed": gates_hold(gates) and not failures,
        "gates": gates,
        "failures": failures,
        "artifacts": artifacts,
        "validation": validation,
        "benchmarks": benchmarks,
    }


def write_reports(report: dict[str, Any], out_dir: Path, formats: list[str]) -> list[Path]:
    """Write the asked formats atomically; report.json is always written."""
    written = [out_dir / "report.json"]
    write_json_atomic(written[0], report)
    if "md" in formats:
        written.append(out_dir / "report.md")
        write_text_atomic(written[-1], render_markdown(report))
    return written


def _fmt(value: Any, digits: int = 3) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.{digits}g}" if abs(value) < 1e4 else f"{value:.3e}"
    return str(value)


def _gate_rows(report: dict[str, Any]) -> list[str]:
    if not report["gates"]:
        return ["No gates in the recipe."]
    lines = ["| gate | value | verdict |", "|---|---|---|"]
    for gate in report["gates"]:
        bound = " and ".join(part for part in (
            f">= {gate['min']}" if gate["min"] is not None else "",
            f"<= {gate['max']}" if gate["max"] is not None else "") if part)
        verdict = "skipped" if gate.get("skipped") else "PASS" if gate["passed"] else \
            f"**FAIL** {gate['reason']}".strip()
        lines.append(f"| {gate['variant']} on {gate['target']}: {gate['metric']} {bound} | "
                     f"{_fmt(gate['value'], 4)} | {verdict} |")
    return lines


def _matrix_rows(report: dict[str, Any]) -> list[str]:
    sizes = {row["name"]: row["size_bytes"] for row in report["artifacts"]}
    validation = {(row["variant"], row["target"]): row for row in report["validation"]}
    lines = ["| variant | target | batch | p50 ms | p90 ms | speedup | size MB | cosine | max abs err | validation |"
             " benchmark |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for bench in report["benchmarks"] or [{"variant": v, "target": t, "batch_size": None, "status": "skipped",
                                           "latency_ms": None, "speedup": None, "reason": ""}
                                          for v, t in validation]:
        check = validation.get((bench["variant"], bench["target"]), {})
        latency = bench.get("latency_ms") or {}
        metrics = check.get("metrics") or {}
        size = sizes.get(bench["variant"])
        noisy = " (noisy)" if bench.get("noisy") else ""
        lines.append(
            f"| {bench['variant']} | {bench['target']} | {_fmt(bench['batch_size'])} | {_fmt(latency.get('p50'))}"
            f"{noisy} | {_fmt(latency.get('p90'))} | {_fmt(bench.get('speedup'))} | "
            f"{_fmt(size / 1e6 if size else None)} | {_fmt(metrics.get('cosine'), 6)} | "
            f"{_fmt(metrics.get('max_abs_err'))} | {check.get('status', '–')} | {bench['status']} |")
    return lines


def _reasons(report: dict[str, Any]) -> list[str]:
    lines = []
    for failure in report["failures"]:
        lines.append(f"- variant **{failure['variant']}**, stage {failure['stage']}: {failure['reason']}")
    seen = set()
    for row in report["validation"] + report["benchmarks"]:
        if row["status"] in ("passed", "ok") or not row.get("reason"):
            continue
        line = f"- {row['variant']} on {row['target']} ({row['status']}): {row['reason']}"
        if line not in seen:
            seen.add(line)
            lines.append(line)
    return lines


def _findings(report: dict[str, Any]) -> list[str]:
    lines = []
    for artifact in report["artifacts"]:
        chain = " → ".join(f"{step['stage']}{' (cached)' if step['cached'] else ''}" for step in artifact["lineage"])
        lines.append(f"- **{artifact['name']}**: {chain}; sha256 `{artifact['sha256'][:16]}…`, "
                     f"{artifact['size_bytes'] / 1e6:.2f} MB")
    return lines


def render_markdown(report: dict[str, Any]) -> str:
    env = report["environment"]
    verdict = "all gates hold" if report["passed"] else "**FAILED**"
    parts = [
        f"# qdeploy report: {report['recipe']['name']}",
        "",
        f"Verdict: {verdict}. Reference: `{report['reference']['variant']}` on `{report['reference']['target']}`. "
        f"Run took {report['seconds']:.1f} s.",
        "", "## Gates", "", *_gate_rows(report),
        "", "## Latency and accuracy", "", *_matrix_rows(report),
        "", "Speedup is the reference's median latency over the variant's on the same target, within interleaved "
        "rounds. Cosine and max abs err compare with the reference outputs on the same inputs.",
    ]
    reasons = _reasons(report)
    if reasons:
        parts += ["", "## Failures, unavailable targets and warnings", "", *reasons]
    warnings = sorted({w for row in report["validation"] for w in row.get("warnings", [])})
    parts += [f"- {warning}" for warning in warnings]
    parts += ["", "## Artifacts", "", *_findings(report)]
    cpu = env["cpu"]
    flags = ", ".join(flag for flag, present in cpu["flags"].items() if present) or "none"
    versions = ", ".join(f"{name} {version}" for name, version in env["versions"].items())
    parts += ["", "## Environment", "", f"- CPU: {cpu['model']} ({cpu['cores']} cores; {flags})",
              f"- Python {env['python']}; {versions}",
              f"- Available targets: {', '.join(env['available_targets'])}", ""]
    return "\n".join(parts)
