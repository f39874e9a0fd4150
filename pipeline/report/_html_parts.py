"""Small HTML pieces of report.html: status badges and a generic, readable rendering of findings.

Stages write findings as free-form JSON (counts, lists of node names, nested dicts, lists of records); the
renderer knows no stage: scalars become a definition list, lists of records a table, long lists are cut with
the rest behind a collapsed <details>, nested dicts nest.
"""

from __future__ import annotations

from typing import Any

from qdeploy.pipeline.report.format import escape_html, fmt_number

LIST_SHOWN = 24
"""Items of a list shown before the rest goes behind a collapsed <details>."""
TABLE_MAX_COLUMNS = 8
MAX_DEPTH = 6



def status_badge(status: str) -> str:
    word = str(status).lower()
    css = word if word in ("pass", "fail", "skip", "passed", "failed", "ok", "error", "unavailable") else "none"
    return f"<span class=\"badge {css}\">{escape_html(status)}</span>"


def findings_html(value: Any, depth: int = 0) -> str:
    """Any JSON value as readable HTML."""
    if depth > MAX_DEPTH:
        return f"<code>{escape_html(_short_json(value))}</code>"
    if isinstance(value, dict):
        return _dict_html(value, depth)
    if isinstance(value, list):
        return _list_html(value, depth)
    return escape_html(fmt_number(value, 6, style="value"))


def _dict_html(value: dict[str, Any], depth: int) -> str:
    if not value:
        return "<span class=\"note\">(none)</span>"
    terms = []
    nested = []
    for key, item in value.items():
        if (isinstance(item, dict) and item) or (isinstance(item, list) and item and _is_records(item)):
            nested.append(f"<details><summary>{escape_html(key)} ({len(item)})</summary>"
                          f"{findings_html(item, depth + 1)}</details>")
        else:
            terms.append(f"<dt>{escape_html(key)}</dt><dd>{findings_html(item, depth + 1)}</dd>")
    listing = f"<dl class=\"findings\">{''.join(terms)}</dl>" if terms else ""
    return listing + "".join(nested)


def _is_records(items: list[Any]) -> bool:
    return all(isinstance(item, dict) for item in items)


def _list_html(items: list[Any], depth: int) -> str:
    if not items:
        return "<span class=\"note\">(none)</span>"
    if _is_records(items):
        return _records_html(items, depth)
    shown = ", ".join(_inline(item, depth) for item in items[:LIST_SHOWN])
    if len(items) <= LIST_SHOWN:
        return shown
    rest = ", ".join(_inline(item, depth) for item in items[LIST_SHOWN:])
    return f"{shown} <details><summary>{len(items) - LIST_SHOWN} more</summary>{rest}</details>"


def _inline(item: Any, depth: int) -> str:
    if isinstance(item, str):
        return f"<code>{escape_html(item)}</code>"
    return findings_html(item, depth + 1)


def _records_html(records: list[dict[str, Any]], depth: int) -> str:
    """A list of dicts: a table when they share a few scalar columns, else one block each."""
    columns = list(dict.fromkeys(key for record in records for key in record))
    scalar = all(not isinstance(record.get(key), dict | list) or not record.get(key)
                 for record in records for key in columns)
    if scalar and len(columns) <= TABLE_MAX_COLUMNS:
        head = "".join(f"<th>{escape_html(column)}</th>" for column in columns)
        rows = "".join("<tr>" + "".join(f"<td>{findings_html(record.get(column), depth + 1)}</td>"
                                        for column in columns) + "</tr>" for record in records[:200])
        more = f"<p class=\"note\">{len(records) - 200} more rows in report.json</p>" if len(records) > 200 else ""
        return f"<table><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>{more}"
    return "".join(f"<details><summary>#{index + 1}</summary>{findings_html(record, depth + 1)}</details>"
                   for index, record in enumerate(records[:200]))


def _short_json(value: Any, limit: int = 300) -> str:
    import json

    text = json.dumps(value, default=str)
    return text if len(text) <= limit else text[: limit - 1] + "…"
