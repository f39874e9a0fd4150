"""report.html pieces of issue 18: 'What to ship' at the top of the page, and the throughput table."""

from __future__ import annotations

import html
from typing import Any

from qdeploy.pipeline.report._html_parts import status_badge
from qdeploy.pipeline.report.format import fmt_number, fmt_speedup
from qdeploy.pipeline.report.precision import speedup_sides
from qdeploy.pipeline.report.tables import report_verdict
from qdeploy.pipeline.report.verdict import describe, in_recipe_order, short_reason
from qdeploy.pipeline.report.view import unavailable_targets

VERDICT_CSS = """
.ship { border: 1px solid var(--line); border-left: 4px solid var(--pass); border-radius: 6px; padding: 8px 12px;
        margin: 8px 0; }
.ship.none { border-left-color: var(--off); }
.ship .pick { font-size: 15px; } .ship .pick strong.variant { font-size: 16px; }
.ship ul { margin: 4px 0 0; padding-left: 20px; color: var(--muted); }
p.lacks { color: var(--off); margin: 6px 0; }
"""


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def verdict_html(report: dict[str, Any]) -> str:
    """One card per target: the artifact to ship, its numbers and why; then the targets this machine lacks."""
    section = report_verdict(report)
    cards = []
    for target, verdict in in_recipe_order(section):
        details = []
        if verdict.get("runner_up"):
            runner = verdict["runner_up"]
            details.append(f"runner-up <strong>{_e(runner['variant'])}</strong>: {_e(describe(runner))}")
        details += [f"not {_e(variant)}: {_e(reason)}" for variant, reason in (verdict.get("rejected") or {}).items()]
        listing = f"<ul>{''.join(f'<li>{item}</li>' for item in details)}</ul>" if details else ""
        if verdict["status"] == "ship":
            pick = (f"<div class=\"pick\"><code>{_e(target)}</code>: ship <strong class=\"variant\">"
                    f"{_e(verdict['variant'])}</strong>: {_e(describe(verdict))}</div>"
                    f"<div class=\"note\">{_e(verdict['why'])}</div>")
            cards.append(f"<div class=\"ship\">{pick}{listing}</div>")
        else:
            cards.append(f"<div class=\"ship none\"><div class=\"pick\"><code>{_e(target)}</code>: nothing to "
                         f"ship: {_e(verdict['why'])}</div>{listing}</div>")
    unreadable = section.get("unreadable") or {}  # the target cannot read the original model: said once
    cards += [f"<div class=\"ship none\"><div class=\"pick\"><code>{_e(target)}</code>: "
              f"{'the original model is unreadable here' if target in section['targets'] else 'nothing to ship'}, "
              f"not a failure of a variant: {_e(why)}</div></div>" for target, why in unreadable.items()]
    lacks = unavailable_html(section.get("unavailable") or {})
    if not cards and not lacks:
        return ""
    by = {"latency": "median latency", "throughput": "inferences per second", "size": "size (nothing was "
          "benchmarked)"}[section["by"]]
    return (f"<h2>What to ship</h2><p class=\"note\">Per target, the fastest artifact whose validation passed and "
            f"whose gates hold (ranked by {by}); among artifacts the benchmark cannot tell apart, the smallest. "
            f"Failed, errored and unavailable rows are never recommended.</p>{''.join(cards)}{lacks}")


def unavailable_html(missing: dict[str, str]) -> str:
    if not missing:
        return ""
    reasons = "; ".join(dict.fromkeys(short_reason(reason) for reason in missing.values()))
    names = ", ".join(f"<code>{_e(name)}</code>" for name in missing)
    return f"<p class=\"lacks\">Not available on this machine: {names} ({_e(reasons)}).</p>"


def throughput_html(report: dict[str, Any]) -> str:
    """Inferences per second with many requests in flight, and the latency at that load."""
    missing = unavailable_targets(report)
    rows = [row for row in report.get("throughput") or [] if row["target"] not in missing]
    if not rows:
        return ""
    head = "".join(f"<th>{name}</th>" for name in (
        "variant", "target", "batch", "inferences/s", "vs reference [rounds]", "requests in flight",
        "streams × threads", "p50 ms at load", "p99 ms at load", "status"))
    body = []
    for row in rows:
        latency = row.get("latency_ms") or {}
        cells = [_e(row["variant"]), _e(row["target"]), _e(fmt_number(row.get("batch_size"))),
                 _e(fmt_number(row.get("inferences_per_s"))),
                 _e(" ".join(filter(None, (fmt_speedup(row.get("speedup"), row.get("speedup_range")),
                                           speedup_sides(report, row, "throughput"))))),
                 _e(fmt_number(row.get("requests_in_flight"))),
                 _e(f"{fmt_number(row.get('streams'))} × {fmt_number(row.get('threads_per_request'))}"),
                 _e(fmt_number(latency.get("p50"))), _e(fmt_number(latency.get("p99"))),
                 status_badge(row.get("status", "?")) + (f" <span class=\"note\">{_e(row['reason'])}</span>"
                                                          if row.get("reason") else "")]
        body.append("<tr>" + "".join(f"<td>{cell}</td>" for cell in cells) + "</tr>")
    return ("<h2>Throughput, many requests in flight</h2><div class=\"scroll\"><table class=\"matrix\"><thead><tr>"
            f"{head}</tr></thead><tbody>{''.join(body)}</tbody></table></div><p class=\"note\">Inferences per second "
            "over all timed rounds with every request kept busy (rounds interleaved with the other artifacts); the "
            "latency is each "
            "request's own at that load. The latency table's <em>serial rate</em> is batch / p50 of one request at a "
            "time, not a throughput.</p>")
