"""Decode benchmarks of language models with a KV cache in the report: each row's ``decode`` record
(``qdeploy.stages.benchmark._decode.DecodeRecordDict``) as a table of prefill ms and decode tokens/s, and each
variant's decode speed against the reference variant on the same target ("int4 decode 2.10x fp32").  Nothing is
shown when no row has a decode record."""

from __future__ import annotations

from typing import Any

from qdeploy.core.report import Report
from qdeploy.core.rows import BenchmarkRow
from qdeploy.core.values import is_finite_number
from qdeploy.pipeline.report.format import escape_html, fmt_number

__all__ = ["DECODE_HEAD", "decode_html", "decode_markdown", "decode_rows", "decode_speedup", "decode_speedup_line",
           "with_decode_speedup"]

DECODE_HEAD = ("variant", "target", "batch", "prompt → cache", "prefill ms [95% CI]", "decode ms/token",
               "decode tokens/s", "decode vs reference", "steps × repeats", "bounded by")
_EXPLAINED = ("Prefill: one call with the prompt and an empty cache. Decode: single-token steps, each fed the greedy "
              "next token and the previous step's presents as past (the cache grows from the prompt to the cache "
              "length shown); ms/token is the median over every step of every repeat, tokens/s = 1000 / ms per "
              "token, per sequence. Only the runtime call is timed. Decode vs reference: the reference variant's "
              "ms per token over this variant's on the same target (above 1: faster).")


def _decode(row: BenchmarkRow) -> dict[str, Any]:
    return row.decode or {}


def decode_rows(report: Report) -> list[BenchmarkRow]:
    """The benchmark rows that carry a decode record."""
    return [row for row in report.benchmarks if row.status == "ok" and row.decode]


def decode_speedup(rows: list[BenchmarkRow], row: BenchmarkRow, reference: str) -> float | None:
    """Decode ms per token of the reference variant over this row's, on the same target; None without both."""
    mine = _decode(row).get("decode_ms_per_token")
    ref = next((other for other in rows if other.variant == reference and other.target == row.target
                and other.status == "ok" and other.decode), None)
    theirs = _decode(ref).get("decode_ms_per_token") if ref is not None else None
    if not (is_finite_number(mine) and is_finite_number(theirs)) or mine <= 0:
        return None
    return float(theirs) / float(mine)


def with_decode_speedup(rows: list[BenchmarkRow], row: BenchmarkRow, reference: str) -> BenchmarkRow:
    """The row with its decode record's ``speedup`` set (rows without a decode record unchanged)."""
    if not row.decode:
        return row
    return row.replace(decode={**row.decode, "speedup": decode_speedup(rows, row, reference)})


def decode_speedup_line(row: BenchmarkRow, reference: str) -> str:
    """'int4 decode 2.10x fp32 (41.2 vs 19.6 tokens/s)'; '' for the reference itself or without a speedup."""
    record = _decode(row)
    ratio = record.get("speedup")
    if row.variant == reference or not is_finite_number(ratio):
        return ""
    rate = record.get("tokens_per_s")
    theirs = rate / ratio if is_finite_number(rate) and ratio > 0 else None
    return (f"{row.variant} decode {ratio:.2f}x {reference} ({fmt_number(rate)} vs {fmt_number(theirs)} "
            "tokens/s)")


def _cells(row: BenchmarkRow, reference: str) -> list[str]:
    record = _decode(row)
    ci = record.get("prefill_ci95_ms") or []
    interval = f" [{fmt_number(ci[0])}–{fmt_number(ci[1])}]" if len(ci) == 2 else ""
    ratio = record.get("speedup")
    versus = "reference" if row.variant == reference else (f"{ratio:.2f}x" if is_finite_number(ratio) else "–")
    bounded = str(record.get("bounded_by", "–"))
    return [row.variant, row.target, fmt_number(row.batch_size),
            f"{fmt_number(record.get('prompt'))} → {fmt_number(record.get('cache_length'))}",
            f"{fmt_number(record.get('prefill_ms'))}{interval}", fmt_number(record.get("decode_ms_per_token")),
            fmt_number(record.get("tokens_per_s")), versus,
            f"{fmt_number(record.get('steps_run'))} of {fmt_number(record.get('tokens'))} × "
            f"{fmt_number(record.get('repeats'))}",
            bounded if bounded != "max_seconds" else f"max_seconds ({fmt_number(record.get('max_seconds'))} s)"]


def _speedup_lines(report: Report) -> list[str]:
    reference = report.reference.variant
    lines = []
    for row in decode_rows(report):
        line = decode_speedup_line(row, reference)
        if line:
            lines.append(f"{row.target}: {line}")
    return lines


def decode_markdown(report: Report) -> list[str]:
    """'## Decode (language model, KV cache)': the table and the speedups; [] when no row has a decode record."""
    rows = decode_rows(report)
    if not rows:
        return []
    reference = report.reference.variant
    lines = ["## Decode (language model, KV cache)", "", "| " + " | ".join(DECODE_HEAD) + " |",
             "|" + "---|" * len(DECODE_HEAD)]
    lines += ["| " + " | ".join(_cells(row, reference)) + " |" for row in rows]
    lines += ["", _EXPLAINED]
    speedups = _speedup_lines(report)
    return lines + (["", *[f"- {line}" for line in speedups]] if speedups else [])


def decode_html(report: Report) -> str:
    """The decode table and speedups as HTML; '' when no row has a decode record."""
    rows = decode_rows(report)
    if not rows:
        return ""
    reference = report.reference.variant
    head = "".join(f"<th>{escape_html(name)}</th>" for name in DECODE_HEAD)
    body = "".join("<tr>" + "".join(f"<td>{escape_html(cell)}</td>" for cell in _cells(row, reference)) + "</tr>"
                   for row in rows)
    speedups = "".join(f"<li>{escape_html(line)}</li>" for line in _speedup_lines(report))
    return ("<h2>Decode (language model, KV cache)</h2><div class=\"scroll\"><table class=\"matrix\"><thead><tr>"
            f"{head}</tr></thead><tbody>{body}</tbody></table></div>"
            + (f"<ul class=\"plain\">{speedups}</ul>" if speedups else "")
            + f"<p class=\"note\">{escape_html(_EXPLAINED)}</p>")
