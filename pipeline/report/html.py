"""report.html: one self-contained page (inline CSS, inline SVG charts, no script, nothing fetched).

Order of the page: verdict and gates first, then the variant x target table, the charts, validation notes,
how latency was measured, each artifact's lineage and findings (collapsed), and the environment fingerprint.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from qdeploy.core.report import Report, as_report
from qdeploy.core.report_parts import ArtifactRecord
from qdeploy.pipeline.report._html_layers import LAYERS_CSS, layers_html
from qdeploy.pipeline.report._html_parts import findings_html, status_badge
from qdeploy.pipeline.report._html_verdict import VERDICT_CSS, throughput_html, unavailable_html, verdict_html
from qdeploy.pipeline.report.budget_front import budget_front_html
from qdeploy.pipeline.report.charts import colors_for, latency_bars_svg, tradeoff_svg
from qdeploy.pipeline.report.decode import decode_html
from qdeploy.pipeline.report.format import (
    escape_html,
    fmt_cosine_cell,
    fmt_number,
    fmt_snr_cell,
    fmt_speedup,
)
from qdeploy.pipeline.report.precision import speedup_sides
from qdeploy.pipeline.report.sections import noise_floor_lines, package_lines
from qdeploy.pipeline.report.view import (
    MatrixRow,
    benchmark_settings,
    gate_label,
    gate_verdict,
    has_task_metric,
    highlights,
    lineage_chain,
    matrix,
    problems,
    task_metric_label,
    tradeoff_points,
    unavailable_targets,
    unmeasured_lines,
    validation_notes,
)

__all__ = ["CSS", "TABLE_HEAD", "render_html"]

CSS = """
:root { --ink:#1f2328; --muted:#656d76; --line:#d0d7de; --soft:#f6f8fa; --pass:#1a7f37; --fail:#cf222e;
        --skip:#9a6700; --off:#6e7781; }
* { box-sizing: border-box; }
body { font: 14px/1.45 -apple-system, "Segoe UI", "DejaVu Sans", Helvetica, Arial, sans-serif; color: var(--ink);
       margin: 0 auto; padding: 24px 32px 48px; max-width: 1240px; background: #fff; }
h1 { font-size: 24px; margin: 0 0 4px; } h2 { font-size: 18px; margin: 28px 0 10px; padding-bottom: 4px;
     border-bottom: 1px solid var(--line); } h3 { font-size: 15px; margin: 16px 0 6px; }
.sub { color: var(--muted); margin: 0 0 12px; }
.verdict { display: inline-block; padding: 6px 14px; border-radius: 6px; font-weight: 700; font-size: 16px;
           color: #fff; margin: 8px 0; }
.verdict.pass { background: var(--pass); } .verdict.fail { background: var(--fail); }
table { border-collapse: collapse; width: 100%; margin: 6px 0 10px; font-variant-numeric: tabular-nums; }
th, td { border-bottom: 1px solid var(--line); padding: 4px 6px; text-align: left; vertical-align: top; }
table.matrix { font-size: 13px; } table.matrix th { white-space: normal; }
th { background: var(--soft); font-weight: 600; white-space: nowrap; }
td.num { text-align: right; white-space: nowrap; }
tr.group td { background: #eef2f6; font-weight: 600; }
tr.dim td { color: var(--off); }
.badge { display: inline-block; padding: 1px 7px; border-radius: 10px; font-size: 12px; font-weight: 600;
         color: #fff; white-space: nowrap; }
.badge.pass, .badge.passed, .badge.ok { background: var(--pass); }
.badge.fail, .badge.failed, .badge.error { background: var(--fail); }
.badge.skip, .badge.noisy { background: var(--skip); } .badge.unavailable, .badge.none { background: var(--off); }
.swatch { display: inline-block; width: 10px; height: 10px; border-radius: 2px; margin-right: 6px; }
.note { color: var(--muted); font-size: 12.5px; }
.ci { color: var(--muted); font-size: 11.5px; }
.charts { display: grid; grid-template-columns: repeat(auto-fit, minmax(520px, 1fr)); gap: 18px; }
.scroll { overflow-x: auto; }
.chart { border: 1px solid var(--line); border-radius: 6px; padding: 8px; }
.chart svg { width: 100%; height: auto; display: block; }
.problems { border-left: 4px solid var(--fail); background: #fff5f5; padding: 8px 12px; margin: 10px 0; }
.problems.soft { border-left-color: var(--skip); background: #fffaf0; }
.problems ul, .plain { margin: 4px 0; padding-left: 20px; }
details { border: 1px solid var(--line); border-radius: 6px; margin: 6px 0; padding: 4px 10px; }
details > summary { cursor: pointer; font-weight: 600; padding: 2px 0; }
details details { border: none; padding: 0 0 0 12px; margin: 2px 0; }
details details > summary { font-weight: 500; color: var(--muted); }
dl.findings { margin: 4px 0 8px; display: grid; grid-template-columns: max-content 1fr; gap: 2px 14px; }
dl.findings dt { color: var(--muted); } dl.findings dd { margin: 0; word-break: break-word; }
code { font: 12.5px ui-monospace, "DejaVu Sans Mono", monospace; background: var(--soft); padding: 0 3px;
       border-radius: 3px; }
.chain span.step { display: inline-block; border: 1px solid var(--line); border-radius: 4px; padding: 0 6px;
                   margin: 2px 0; background: var(--soft); }
.chain span.arrow { color: var(--muted); margin: 0 4px; }
ul.hl { margin: 4px 0; padding-left: 20px; }
"""



def render_html(report: Report | Mapping[str, Any]) -> str:
    """The whole page as one string."""
    report = as_report(report)
    rows = matrix(report)
    colors = colors_for([artifact.name for artifact in report.artifacts] + [r.variant for r in rows])
    sections = [
        _header(report), verdict_html(report), _unmeasured(report), _gates(report), _problems(report),
        _table(report, rows, colors), throughput_html(report), decode_html(report), _charts(report, rows, colors),
        layers_html(report),
        budget_front_html(report),
        _validation(report), _settings(report), _artifacts(report), _packages(report), _environment(report),
    ]
    title = escape_html(f"qdeploy report: {report.recipe.name}")
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
            f"<title>{title}</title><style>{CSS}{VERDICT_CSS}{LAYERS_CSS}</style></head><body>\n"
            + "\n".join(part for part in sections if part) + "\n</body></html>\n")


def _header(report: Report) -> str:
    passed = report.passed
    verdict = "PASSED: every gate holds" if passed else "FAILED"
    source = report.recipe.path or "(recipe given in code)"
    return (f"<h1>qdeploy report: {escape_html(report.recipe.name)}</h1>"
            f"<p class=\"sub\">recipe <code>{escape_html(source)}</code> · created "
            f"{escape_html(report.created)} · run took {fmt_number(report.seconds, style='value')} s"
            f" · reference <code>{escape_html(report.reference.variant)}</code> on "
            f"<code>{escape_html(report.reference.target)}</code></p>"
            f"<div class=\"verdict {'pass' if passed else 'fail'}\">{escape_html(verdict)}</div>")


def _unmeasured(report: Report) -> str:
    lines = unmeasured_lines(report)
    if not lines:
        return ""
    hard = any(not row.allowed for row in report.unmeasured)
    items = "".join(f"<li>{escape_html(line)}</li>" for line in lines)
    return (f"<div class=\"problems{'' if hard else ' soft'}\"><strong>Asked for but not measured</strong>"
            f"<ul>{items}</ul></div>")


def _gates(report: Report) -> str:
    if not report.gates:
        return "<h2>Gates</h2><p class=\"note\">No gates in the recipe.</p>"
    body = []
    for gate in report.gates:
        verdict = gate_verdict(gate)
        body.append(f"<tr><td>{status_badge(verdict)}</td><td>{escape_html(gate_label(gate))}</td>"
                    f"<td class=\"num\">{escape_html(fmt_number(gate.value, 4, style='value'))}</td>"
                    f"<td>{escape_html(gate.reason)}</td></tr>")
    return ("<h2>Gates</h2><table><thead><tr><th>verdict</th><th>gate</th><th>measured</th><th>reason</th></tr>"
            f"</thead><tbody>{''.join(body)}</tbody></table>")


def _problems(report: Report) -> str:
    lines = problems(report)
    if not lines:
        return ""
    hard = bool(report.failures) or any(r.status in ("failed", "error") for r in [*report.validation,
                                                                                  *report.benchmarks])
    items = "".join(f"<li>{escape_html(line)}</li>" for line in lines)
    title = "Failures and unavailable targets" if hard else "Unavailable targets"
    return f"<div class=\"problems{'' if hard else ' soft'}\"><strong>{title}</strong><ul>{items}</ul></div>"


TABLE_HEAD = ("variant", "precision ran", "batch", "p50 ms [95% CI]", "p90 ms", "p99 ms", "speedup [rounds]",
              "serial rate /s", "size MB", "peak mem MB", "cosine", "SNR dB", "max abs err", "top-1", "validation",
              "benchmark")


def _table(report: Report, rows: list[MatrixRow], colors: dict[str, str]) -> str:
    task = has_task_metric(report)
    kl = any(row.metrics.has("kl") for row in report.validation)  # language-model logits only
    middle = (*(["KL/token"] if kl else []), *([task_metric_label(report)] if task else []))
    names = (*TABLE_HEAD[:-2], *middle, *TABLE_HEAD[-2:])
    head = "".join(f"<th>{escape_html(name)}</th>" for name in names)
    body = []
    missing = unavailable_targets(report)
    for target in dict.fromkeys(row.target for row in rows if row.target not in missing):
        body.append(f"<tr class=\"group\"><td colspan=\"{len(names)}\">{escape_html(target)}</td></tr>")
        body += [_table_row(row, colors, task, speedup_sides(report, row.bench) if row.bench else "", kl=kl)
                 for row in rows if row.target == target]
    reference = escape_html(report.reference.variant)
    return ("<h2>Latency and accuracy, variant × target</h2>"
            f"<div class=\"scroll\"><table class=\"matrix\"><thead><tr>{head}</tr></thead>"
            f"<tbody>{''.join(body)}</tbody></table></div>{unavailable_html(missing)}"
            f"<p class=\"note\">Speedup: the median latency of <code>{reference}</code> over the variant's on the same "
            "target and batch, the median of per-round ratios of interleaved rounds (range of the rounds below; "
            "≈ when the rounds disagree on which is faster). p50 shows its 95% confidence interval; "
            "<em>noisy</em>: that interval is wider than 10% of the median. Fidelity metrics compare with the "
            "reference outputs on the same inputs. Peak memory: resident-memory growth over session creation, "
            "first run and warm-up.</p>")


def _table_row(row: MatrixRow, colors: dict[str, str], task: bool, sides: str = "", *, kl: bool = False) -> str:
    latency, metrics, bench = row.latency, row.metrics, row.bench
    ci = latency.ci95_p50 if latency else None
    p50 = escape_html(fmt_number(row.p50, style="value"))
    if ci:
        low, high = (escape_html(fmt_number(end, style="value")) for end in ci[:2])
        p50 += f"<br><span class=\"ci\">[{low}–{high}]</span>"
    if bench is not None and bench.noisy:
        p50 += " <span class=\"badge noisy\">noisy</span>"
    low_high = bench.speedup_range if bench is not None else None
    speed = escape_html(fmt_speedup(row.speedup, None if row.speedup_undecided else low_high))
    if row.speedup is not None and low_high and low_high != [1.0, 1.0]:
        speed = escape_html("≈1x") if row.speedup_undecided else speed
        speed += f"<br><span class=\"ci\">[{low_high[0]:.2f}–{low_high[1]:.2f}]</span>"
    if sides:
        speed += f"<br><span class=\"ci\">{escape_html(sides)}</span>"
    swatch = f"<span class=\"swatch\" style=\"background:{colors.get(row.variant, '#999')}\"></span>"
    cells = [
        f"<td>{swatch}{escape_html(row.variant)}</td>", f"<td>{escape_html(row.precision_ran)}</td>", _num(row.batch),
        f"<td class=\"num\">{p50}</td>",
        _num(latency.p90 if latency else None), _num(latency.p99 if latency else None),
        f"<td class=\"num\">{speed}</td>",
        _num(bench.throughput_per_s if bench else None), _num(row.size_bytes / 1e6 if row.size_bytes else None),
        _num(row.peak_memory_mb), _text(fmt_cosine_cell(metrics)), _text(fmt_snr_cell(metrics.snr_db)),
        _num(metrics.max_abs_err), _num(metrics.top1_agreement), *([_num(metrics.kl, 4)] if kl else []),
        *([_num(metrics.task_metric, 4)] if task else []),
        f"<td>{status_badge(row.validation_status) if row.check else '–'}</td>",
        f"<td>{status_badge(row.benchmark_status) if row.bench else '–'}</td>",
    ]
    dim = " class=\"dim\"" if row.status == "unavailable" else ""
    return f"<tr{dim}>{''.join(cells)}</tr>"


def _num(value: Any, digits: int = 3) -> str:
    return f"<td class=\"num\">{escape_html(fmt_number(value, digits, style='value'))}</td>"


def _text(value: str) -> str:
    return f"<td class=\"num\">{escape_html(value)}</td>"


def _charts(report: Report, rows: list[MatrixRow], colors: dict[str, str]) -> str:
    bars = latency_bars_svg(rows, colors)
    points, label = tradeoff_points(report)
    scatter = tradeoff_svg(points, label, colors)
    if not bars and not scatter:
        return "<h2>Charts</h2><p class=\"note\">Nothing was benchmarked, so there is nothing to plot.</p>"
    fronts = "; ".join(
        f"{target}: " + ", ".join(p.variant for p in sorted(points, key=lambda p: p.latency_ms)
                                  if p.on_front and p.target == target)
        for target in dict.fromkeys(p.target for p in points))
    capped = " ≥ marks identical outputs (SNR at its 200 dB cap), drawn 10 dB above the highest measured SNR " \
             "so the cap does not flatten the axis." if any(p.capped for p in points) else ""
    caption = f"<p class=\"note\">Pareto front per target, artifacts that passed validation only (nothing " \
              f"else on that target is both faster and closer to the reference): {escape_html(fronts)}.{capped}</p>" \
        if fronts else ""
    charts = "".join(f"<div class=\"chart\">{svg}</div>" for svg in (bars, scatter) if svg)
    return f"<h2>Charts</h2><div class=\"charts\">{charts}</div>{caption}"


def _validation(report: Report) -> str:
    items = []
    for row in report.validation:
        notes = validation_notes(row)
        if notes:
            inner = "".join(f"<li>{escape_html(note)}</li>" for note in dict.fromkeys(notes))
            items.append(f"<li><strong>{escape_html(row.variant)} on {escape_html(row.target)}</strong> "
                         f"{status_badge(row.status)}<ul>{inner}</ul></li>")
    floor = "".join(f"<li>{escape_html(line.removeprefix('noise floor of the reference: '))}</li>"
                    for line in noise_floor_lines(report.noise_floor))
    noise_html = f"<h3>Noise floor of the reference</h3><ul class=\"plain\">{floor}</ul>" if floor else ""
    if not items and not noise_html:
        return ""
    listing = f"<ul class=\"plain\">{''.join(items)}</ul>" if items else ""
    return f"<h2>Validation notes</h2>{listing}{noise_html}"


def _settings(report: Report) -> str:
    lines = benchmark_settings(report)
    if not lines:
        return ""
    items = "".join(f"<li>{escape_html(line)}</li>" for line in lines)
    return (f"<h2>How latency was measured</h2><ul class=\"plain\">{items}</ul><p class=\"note\">Only inference is "
            "timed: inputs are prepared once, session creation and the first run are reported apart "
            "(see report.json: session_create_ms, first_run_ms).</p>")


def _packages(report: Report) -> str:
    """The packages the run wrote, from report.json's ``packages``."""
    lines = package_lines(report)
    if not lines:
        return ""
    items = "".join(f"<li>{escape_html(line).replace('`', '')}</li>" for line in lines)
    return f"<h2>Packages</h2><ul class=\"plain\">{items}</ul>"


def _artifacts(report: Report) -> str:
    cards = []
    for artifact in report.artifacts:
        steps = artifact.lineage
        chain = "<span class=\"arrow\">→</span>".join(
            f"<span class=\"step\">{escape_html(step.stage)}{' (cached)' if step.cached else ''} "
            f"<span class=\"ci\">{escape_html(fmt_number(step.seconds, style='value'))} s</span></span>"
            for step in steps)
        lines = [f"{step.stage}: {line}" for step in steps for line in highlights(step.findings)]
        summary_lines = "".join(f"<li>{escape_html(line)}</li>" for line in lines)
        details = "".join(
            f"<details><summary>{escape_html(step.stage)}: findings</summary>{findings_html(step.findings)}"
            f"<details><summary>config</summary>{findings_html(step.config)}</details></details>"
            for step in steps)
        cards.append(
            f"<details><summary>{escape_html(artifact.name)} · {escape_html(lineage_chain(artifact))} · "
            f"{fmt_number((artifact.size_bytes or 0) / 1e6, style='value')} MB</summary>"
            f"<p class=\"chain\">{chain}</p><p class=\"note\">sha256 "
            f"<code>{escape_html(artifact.sha256)}</code>"
            f"<br>file <code>{escape_html(artifact.path)}</code>{_cache_and_data(artifact)}</p>"
            + (f"<ul class=\"hl\">{summary_lines}</ul>" if summary_lines else "") + details + "</details>")
    if not cards:
        return ""
    return ("<h2>Artifacts: lineage and stage findings</h2><p class=\"note\">Open an artifact for its chain of "
            "stages, what each stage found (clamped values, nodes kept in float, lowered patterns, ...) and its "
            "config.</p>" + "".join(cards))


def _cache_and_data(artifact: ArtifactRecord) -> str:
    """External data files with their own sha256, and a cache entry that had to be rebuilt."""
    parts = [f"<br>external data <code>{escape_html(data.file)}</code> sha256 "
             f"<code>{escape_html(data.sha256)}</code>" for data in artifact.external_data]
    if artifact.cache not in (None, "hit", "built"):
        parts.append(f"<br>cache: {escape_html(artifact.cache)}")
    return "".join(parts)


def _environment(report: Report) -> str:
    env = report.environment
    if env is None:
        return "<h2>Environment</h2><p>not recorded</p>"
    flags = ", ".join(flag for flag, present in env.cpu.flags.items() if present) or "none"
    versions = "".join(f"<tr><td>{escape_html(name)}</td><td>{escape_html(version)}</td></tr>"
                       for name, version in env.versions.items())
    targets = "".join(f"<tr><td>{escape_html(name)}</td><td>{escape_html(state)}</td></tr>"
                      for name, state in env.targets.items())
    return (f"<h2>Environment</h2><p>CPU <strong>{escape_html(env.cpu.model)}</strong>, "
            f"{escape_html(env.cpu.cores)} cores; flags: {escape_html(flags)}<br>Python "
            f"{escape_html(env.python)} on {escape_html(env.platform or '?')}</p>"
            "<details><summary>library versions and targets</summary><table><tbody>"
            f"{versions}</tbody></table><table><thead><tr><th>target</th><th>state</th></tr></thead><tbody>{targets}"
            "</tbody></table></details>")
