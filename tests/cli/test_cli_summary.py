"""What `qdeploy run` prints when it ends, read as a CI log reads it (no terminal: typer's CliRunner): one row a line
however long, every "not X" reason of the verdict shown or counted, cosine and SNR in report.md's words, and a word
on why a target the recipe does not name has rows."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from typer.testing import CliRunner

from qdeploy.cli import app
from qdeploy.pipeline.report import render_markdown
from qdeploy.pipeline.report.verdict import verdict_section
from tests.helpers.reports import bench_row, check_row, synthetic_report

LONG = ("int8-per-channel-entropy-calibrated-smoothquant-alpha-0.5-with-excluded-attention-softmax-nodes-and-"
        "a-name-longer-than-any-terminal")


def _printed(report: dict[str, Any], monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> str:
    """`qdeploy run` through the CLI with the pipeline replaced by ``report``: stdout is no terminal here."""
    import qdeploy.api

    monkeypatch.delenv("COLUMNS", raising=False)
    monkeypatch.setattr(qdeploy.api, "run", lambda *args, **kwargs: SimpleNamespace(
        report=report, out_dir=tmp_path, exit_code=0))
    result = CliRunner().invoke(app, ["run", str(tmp_path / "recipe.yaml")])
    assert result.exit_code == 0, result.output
    return result.stdout


def _long_report() -> dict[str, Any]:
    """A row far wider than any fixed width (a long variant name, a long speedup label) and a cosine of many
    digits, plus the reference's row at the SNR cap."""
    report = synthetic_report()
    report["validation"].append(check_row(LONG, "ort:cpu", 0.99999998, 77.123456))
    report["benchmarks"].append(bench_row(LONG, "ort:cpu", 0.123456, [0.12, 0.13, 0.11], speedup=32.4,
                                          speedup_range=[30.1, 35.2]))
    report["verdict"] = verdict_section(report)
    return report


def _table_rows(printed: str) -> list[str]:
    """The lines between the table's header rule and the blank line that ends it."""
    lines = printed.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip().startswith("───")) + 1
    end = next(i for i in range(start, len(lines)) if not lines[i].strip())
    return lines[start:end]


def test_a_ci_log_gets_one_line_per_row_however_wide(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    report = _long_report()
    rows = _table_rows(_printed(report, monkeypatch, tmp_path))
    shown = [(b["variant"], b["target"]) for b in report["benchmarks"] if b["status"] != "unavailable"]
    assert len(rows) == len(shown), "\n".join(rows)  # nothing folded onto a second line
    long_row = next(line for line in rows if LONG in line)
    assert len(long_row) > 220  # wider than the old fixed width, still one line
    assert "0.999999980" in long_row and "77.1" in long_row and long_row.rstrip().endswith("ok")


def test_cosine_and_snr_read_as_in_report_md(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """fp32 against itself: SNR at its 200 dB cap, which report.md words 'identical outputs', not '200'."""
    report = _long_report()
    rows = {tuple(line.split()[:2]): line for line in _table_rows(_printed(report, monkeypatch, tmp_path))}
    markdown = render_markdown(report).splitlines()
    header = next(line for line in markdown if line.startswith("| variant | target |"))
    names = [cell.strip() for cell in header.strip("|").split("|")]
    for line in markdown:
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        if len(cells) != len(names) or (cells[0], cells[1]) not in rows:
            continue
        for column in ("cosine", "SNR dB"):
            assert f"  {cells[names.index(column)]}  " in rows[cells[0], cells[1]], (column, line)
    fp32 = rows["fp32", "ort:cpu"]
    assert "identical outputs" in fp32 and not re.search(r"\b200\b", fp32)


def _verdict_with_reasons(count: int) -> dict[str, Any]:
    report = synthetic_report()
    report["verdict"] = verdict_section(report)
    pick = report["verdict"]["targets"]["ort:cpu"]
    pick["runner_up"] = None
    pick["rejected"] = {f"v{index}": f"slower: reason number {index}" for index in range(count)}
    return report


def test_every_not_x_reason_of_a_target_is_shown(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    printed = _printed(_verdict_with_reasons(3), monkeypatch, tmp_path)
    for index in range(3):
        assert f"  not v{index}: slower: reason number {index}" in printed, printed


def test_reasons_beyond_the_limit_are_counted(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from qdeploy.cli.summary import MAX_DETAILS

    printed = _printed(_verdict_with_reasons(MAX_DETAILS + 4), monkeypatch, tmp_path)
    shown = [line for line in printed.splitlines() if line.startswith("  not v")]
    assert len(shown) == MAX_DETAILS - 1
    assert "  and 5 more reasons in report.md" in printed, printed


def test_a_target_qdeploy_added_says_why(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The fp16 true-precision check adds reference:cpu rows to a recipe that does not name it."""
    report = synthetic_report()
    report["validation"].append(check_row(
        "fp16", "reference:cpu", 0.99999, 48.3, added="fp16 true-precision check: no GPU target of the recipe is "
        "available here"))
    printed = _printed(report, monkeypatch, tmp_path)
    note = next((line for line in printed.splitlines() if line.startswith("reference:cpu: ")), "")
    assert "not a target of the recipe" in note and "true-precision check" in note, printed
    assert "validate.fp16_reference" in note
