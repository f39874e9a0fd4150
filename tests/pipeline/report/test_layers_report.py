"""The layers section rendered (issue 31): report.md's summary lines, report.html's chart and sorted tables, and
`qdeploy explain`'s text."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from qdeploy.pipeline.report import render_markdown
from qdeploy.pipeline.report._html_layers import PRECISION_COLORS, layers_html, layers_svg
from qdeploy.pipeline.report.html import render_html
from qdeploy.pipeline.report.layers import explain_text, layer_markdown
from tests.helpers.layers_report import layers_section
from tests.helpers.reports import synthetic_report


def _report(layers: int = 4) -> dict:
    return {**synthetic_report(), "layers": layers_section(layers), "seconds": 10.0}


def test_markdown_has_the_summary_lines_and_the_overhead() -> None:
    lines = "\n".join(layer_markdown(_report()))
    assert "## Layers: where the time and the error come from" in lines
    assert "profiling pass (auto): 0.50 s of the run's 10.0 s" in lines
    assert "int8 kernels: 90% of MACs, 80% of time on ort:cpu" in lines
    assert "1 Conv ran in float: kept float by the accuracy budget" in lines
    assert "## Layers" in render_markdown(_report()) and layer_markdown(synthetic_report()) == []


def test_explain_shows_the_top_layers_by_time_and_by_error() -> None:
    text = explain_text(_report(), top=2)
    assert "int8 on ort:cpu (what the verdict ships)" in text
    assert "most time (top 2 of 4 layers):" in text
    time_part = text.split("most time")[1].split("most error")[0]
    assert re.search(r"1 conv_token_1 .* int8 .* 0\.500 .*50%", time_part), time_part
    assert "(gap: added by the runtime)" in time_part  # the Transpose no ONNX node names
    error_part = text.split("most error")[1]
    assert error_part.index("conv_token_1") < error_part.index("conv2")  # 168 dB lost before 2 dB
    assert "[kept float by the accuracy budget" in error_part
    assert "1 ONNX nodes have no layer of their own" in text
    assert "no profiled pair matches" in explain_text(_report(), variant="fp16")


def test_html_section_has_one_chart_and_three_sorted_tables_without_script() -> None:
    page = render_html(_report())
    section = layers_html(_report())
    assert section in page and "<script" not in page
    assert section.count("<svg") == 1 and section.count('<table class="sorted') == 3
    assert 'class="by-time" checked' in section


def test_the_chart_stays_readable_at_300_layers() -> None:
    section = layers_section(300)
    svg = layers_svg(section["pairs"][0]["timeline"])
    assert svg.count("<rect") == 600 and svg.count("<title>") == 600  # a bar and a strip cell per layer
    assert 'viewBox="0 0 1000 196"' in svg and len(svg) < 200_000


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("chromium") is None, reason="chromium is not installed (apt-get install -y chromium)")
def test_the_section_renders_in_headless_chromium(tmp_path: Path) -> None:
    """The page with the section, as Chromium draws it: the chart's bars in the precisions' colours."""
    from PIL import Image

    page = tmp_path / "report.html"
    page.write_text(render_html({**_report(40), "verdict": None}))
    shot = tmp_path / "layers.png"
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
             f"--user-data-dir={tmp_path / 'profile'}"]
    subprocess.run(["chromium", *flags, f"--screenshot={shot}", "--window-size=1280,6000", page.as_uri()],
                   capture_output=True, timeout=120, check=False)
    with Image.open(shot) as image:
        colors = {color for _, color in image.convert("RGB").getcolors(maxcolors=1280 * 6000)}
    for hex_color in (PRECISION_COLORS["int8"], PRECISION_COLORS["f32"]):
        assert tuple(int(hex_color[i:i + 2], 16) for i in (1, 3, 5)) in colors, hex_color
