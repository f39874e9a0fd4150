"""report.html pieces of issue 18: 'What to ship' at the top of the page, and the throughput table."""

from __future__ import annotations

from qdeploy.core.report import Report
from qdeploy.pipeline.report._html_parts import status_badge
from qdeploy.pipeline.report.format import escape_html, fmt_number, fmt_speedup
from qdeploy.pipeline.report.precision import speedup_sides
from qdeploy.pipeline.report.tables import report_verdict
from qdeploy.pipeline.report.verdict_words import (
    describe,
    in_recipe_order,
    package_of,
    ran_phrase,
    short_reason,
    tie_rule_words,
)
from qdeploy.pipeline.report.view import unavailable_targets

VERDICT_CSS = """
.ship { border: 1px solid var(--line); border-left: 4px solid var(--pass); border-radius: 6px; padding: 8px 12px;
        margin: 8px 0; }
.ship.none { border-left-color: var(--off); }
.ship .pick { font-size: 15px; } .ship .pick strong.variant { font-size: 16px; }
.ship .ran { color: var(--muted); } .ship .package { font-family: monospace; font-size: 12px; }
.ship ul { margin: 4px 0 0; padding-left: 20px; color: var(--muted); }
p.lacks { color: var(--off); margin: 6px 0; }
.ship .undecided { color: var(--off); font-weight: bold; }
"""



def verdict_html(report: Report) -> str:
    """One card per target: the artifact to ship, its numbers and why; then the targets this machine lacks."""
    section = report_verdict(report)
    cards = []
    for target, verdict in in_recipe_order(section):
        details = []
        if verdict.runner_up is not None:
            runner = verdict.runner_up
            details.append(f"runner-up <strong>{escape_html(runner.variant)}</strong>"
                           f"{escape_html(ran_phrase(runner))}: {escape_html(describe(runner))}")
        details += [f"not {escape_html(variant)}: {escape_html(reason)}"
                    for variant, reason in verdict.rejected.items()]
        listing = f"<ul>{''.join(f'<li>{item}</li>' for item in details)}</ul>" if details else ""
        if verdict.status == "ship" and verdict.variant is not None:
            package = package_of(report.packages, target, verdict.variant)
            undecided = (f"<div class=\"undecided\">undecided: {escape_html(verdict.undecided)}; meanwhile:</div>"
                         if verdict.undecided else "")
            pick = (f"{undecided}<div class=\"pick\"><code>{escape_html(target)}</code>: ship "
                    "<strong class=\"variant\">"
                    f"{escape_html(verdict.variant)}</strong>"
                    f"<span class=\"ran\">{escape_html(ran_phrase(verdict))}</span>: "
                    f"{escape_html(describe(verdict))}</div><div class=\"note\">{escape_html(verdict.why)}</div>"
                    + (f"<div class=\"package\">{escape_html(package)}</div>" if package else ""))
            cards.append(f"<div class=\"ship\" data-target=\"{escape_html(target)}\">{pick}{listing}</div>")
        else:
            cards.append(f"<div class=\"ship none\"><div class=\"pick\"><code>{escape_html(target)}</code>: "
                         f"nothing to ship: {escape_html(verdict.why)}</div>{listing}</div>")
    cards += [f"<div class=\"ship none\"><div class=\"pick\"><code>{escape_html(target)}</code>: "
              f"{'the original model is unreadable here' if target in section.targets else 'nothing to ship'}, "
              f"not a failure of a variant: {escape_html(why)}</div></div>"
              for target, why in section.unreadable.items()]  # the target cannot read the original model: once
    lacks = unavailable_html(section.unavailable)
    if not cards and not lacks:
        return ""
    by = {"latency": "median latency", "throughput": "inferences per second",
          "decode": "decode ms per token (a language model with a KV cache)",
          "size": "size (nothing was benchmarked)"}[section.by]
    return (f"<h2>What to ship</h2><p class=\"note\">Per target, the fastest artifact whose validation passed and "
            f"whose gates hold (ranked by {by}); {escape_html(tie_rule_words(section))}. In brackets, how it ran: "
            "the artifact's precision, the precision or kernels that ran and where. "
            f"Failed, errored and unavailable rows are never recommended.</p>{''.join(cards)}{lacks}")


def unavailable_html(missing: dict[str, str]) -> str:
    if not missing:
        return ""
    reasons = "; ".join(dict.fromkeys(short_reason(reason) for reason in missing.values()))
    names = ", ".join(f"<code>{escape_html(name)}</code>" for name in missing)
    return f"<p class=\"lacks\">Not available on this machine: {names} ({escape_html(reasons)}).</p>"


def throughput_html(report: Report) -> str:
    """Inferences per second with many requests in flight, and the latency at that load."""
    missing = unavailable_targets(report)
    rows = [row for row in report.throughput if row.target not in missing]
    if not rows:
        return ""
    head = "".join(f"<th>{name}</th>" for name in (
        "variant", "target", "batch", "inferences/s", "vs reference [rounds]", "requests in flight",
        "streams × threads", "p50 ms at load", "p99 ms at load", "status"))
    body = []
    for row in rows:
        latency = row.latency_ms
        cells = [escape_html(row.variant), escape_html(row.target), escape_html(fmt_number(row.batch_size)),
                 escape_html(fmt_number(row.inferences_per_s)),
                 escape_html(" ".join(filter(None, (fmt_speedup(row.speedup, row.speedup_range),
                                                    speedup_sides(report, row))))),
                 escape_html(fmt_number(row.requests_in_flight)),
                 escape_html(f"{fmt_number(row.streams)} × {fmt_number(row.threads_per_request)}"),
                 escape_html(fmt_number(latency.p50 if latency else None)),
                 escape_html(fmt_number(latency.p99 if latency else None)),
                 status_badge(row.status) + (f" <span class=\"note\">{escape_html(row.reason)}</span>"
                                             if row.reason else "")]
        body.append("<tr>" + "".join(f"<td>{cell}</td>" for cell in cells) + "</tr>")
    return ("<h2>Throughput, many requests in flight</h2><div class=\"scroll\"><table class=\"matrix\"><thead><tr>"
            f"{head}</tr></thead><tbody>{''.join(body)}</tbody></table></div><p class=\"note\">Inferences per second "
            "over all timed rounds with every request kept busy (rounds interleaved with the other artifacts); the "
            "latency is each "
            "request's own at that load. The latency table's <em>serial rate</em> is batch / p50 of one request at a "
            "time, not a throughput.</p>")
