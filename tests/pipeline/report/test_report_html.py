"""report.html: one self-contained page, gates first, everything escaped; rendered in headless Chromium."""

from __future__ import annotations

import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest

from qdeploy.pipeline.report import write_reports
from qdeploy.pipeline.report.charts import inline_svg
from qdeploy.pipeline.report.html import render_html
from tests.helpers.demo_report import mixed_rows_report
from tests.helpers.layers_report import layers_section
from tests.helpers.reports import synthetic_report

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


class _References(HTMLParser):
    """Every URL-bearing attribute and CSS url(), and the tags seen."""

    def __init__(self) -> None:
        super().__init__()
        self.urls: list[str] = []
        self.tags: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        for name, value in attrs:
            if value and name in ("src", "href", "xlink:href", "action", "poster", "data", "srcset", "formaction"):
                self.urls.append(value)
            if value and name == "style":
                self.urls += re.findall(r"url\(([^)]*)\)", value)


def external_references(page: str) -> list[str]:
    parser = _References()
    parser.feed(page)
    urls = parser.urls + re.findall(r"url\(([^)]*)\)", page) + re.findall(r"@import\s+([^;]+)", page)
    return [url for url in urls if re.match(r"""\s*['"]?\s*(https?:|//|ftp:)""", url)]


def test_page_is_self_contained_and_escaped() -> None:
    page = render_html(synthetic_report())
    assert external_references(page) == []
    assert not re.search(r"https?://", page)  # not even a namespace URI or a DTD
    parser = _References()
    parser.feed(page)
    assert "script" not in parser.tags and "link" not in parser.tags and "img" not in parser.tags
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert page.count("<svg") == 2  # latency bars and the accuracy-vs-latency scatter


def test_gates_come_first_and_every_section_is_there() -> None:
    page = render_html(synthetic_report())
    order = [page.index(marker) for marker in (
        "<h2>Gates</h2>", "variant × target", "<h2>Charts</h2>", "<h2>Validation notes</h2>", "<h2>Artifacts",
        "<h2>Environment</h2>")]
    assert order == sorted(order)
    assert "FAILED" in page and "badge fail" in page and "badge pass" in page
    assert "Pareto front" in page and "int8 on ort:cpu" in page
    assert "conv_7" in page and "unattainable: atol" in page and "Noise floor" in page
    assert "kept_in_fp32" in page and "pow_1" in page and "FakeQuantize" in page
    assert "Test CPU" in page and "avx2" in page
    assert "variant broken, stage quantize: already quantized" in page
    # the fp16 rounds disagree on which is faster; the page says so next to its speedup
    fp16_row = next(row for row in page.split("<tr") if "fp16</td>" in row)
    assert "≈" in fp16_row and "noisy" in fp16_row


def test_long_lists_collapse_and_empty_runs_still_render() -> None:
    page = render_html(synthetic_report())
    assert "16 more</summary>" in page  # 40 items, 24 shown
    report = synthetic_report()
    report["benchmarks"], report["gates"], report["failures"], report["artifacts"] = [], [], [], []
    empty = render_html(report)
    assert "No gates in the recipe." in empty and "nothing to plot" in empty and "<svg" not in empty


def test_inline_svg_drops_prolog_metadata_and_namespaces() -> None:
    raw = ('<?xml version="1.0" encoding="utf-8" standalone="no"?>\n<!DOCTYPE svg PUBLIC "-//W3C//DTD SVG 1.1//EN"'
           ' "http://www.w3.org/Graphics/SVG/1.1/DTD/svg11.dtd">\n<svg xmlns:xlink="http://www.w3.org/1999/xlink" '
           'width="432pt" height="288pt" viewBox="0 0 432 288" xmlns="http://www.w3.org/2000/svg" version="1.1">'
           '<metadata><rdf:RDF><cc:Work><dc:type rdf:resource="http://purl.org/dc/dcmitype/StillImage"/></cc:Work>'
           '</rdf:RDF></metadata><g id="figure_1"/></svg>')
    svg = inline_svg(raw)
    assert svg.startswith("<svg") and "http" not in svg and 'viewBox="0 0 432 288"' in svg
    assert "width=" not in svg.split(">")[0]  # scales with the page


def test_write_reports_writes_the_html_asked_for(tmp_path: Path) -> None:
    written = write_reports(synthetic_report(), tmp_path, ["json", "md", "html"])
    assert [path.name for path in written] == ["report.json", "report.md", "report.html"]
    assert (tmp_path / "report.html").read_text().startswith("<!DOCTYPE html>")
    only_json = write_reports(synthetic_report(), tmp_path / "j", ["json"])
    assert [path.name for path in only_json] == ["report.json"]


def _chromium() -> str | None:
    return next((found for name in CHROMIUM_NAMES if (found := shutil.which(name))), None)


@pytest.mark.skipif(_chromium() is None, reason="chromium is not installed (apt-get install -y chromium)")
def test_page_renders_in_headless_chromium(tmp_path: Path) -> None:
    from PIL import Image, ImageStat

    page = tmp_path / "report.html"
    page.write_text(render_html({**synthetic_report(), "layers": layers_section()}))  # issue 31's section too
    shot = tmp_path / "shot.png"
    command = [_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
               "--disable-background-networking", "--disable-component-update", "--disable-sync",
               f"--user-data-dir={tmp_path / 'profile'}", f"--screenshot={shot}", "--window-size=1280,2000",
               page.as_uri()]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    assert shot.is_file(), done.stderr[-2000:]
    with Image.open(shot) as image:
        assert image.size == (1280, 2000)
        gray = image.convert("L")
        assert ImageStat.Stat(gray).stddev[0] > 20  # text, tables and charts, not a blank page
        top = gray.crop((0, 0, 1280, 400))
        assert ImageStat.Stat(top).stddev[0] > 20  # the verdict and gates are at the top
        colors = image.convert("RGB").resize((320, 500)).getcolors(maxcolors=320 * 500)
        assert colors is not None and len(colors) > 50  # charts and badges in colour, not a text dump


def _headless(tmp_path: Path, *flags: str) -> list[str]:
    return [str(_chromium()), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            f"--user-data-dir={tmp_path / 'profile'}", *flags]


VERDICT_RAN = {  # per target of mixed_rows_report: the pick and how it ran, as the page must show it
    "ort:cpu": "ship fp16 (fp16 artifact, but onnxruntime ran all 13 of its kernels in float32 on CPUExecutionProvider",
    "openvino:cpu": "ship int8 (int8 artifact with float parts at bf16 (device default) on OpenVINO CPU)",
    "ort:cuda": "ship fp16 (fp16 artifact, onnxruntime ran 11 fp16 + 2 fp32 kernels on CUDAExecutionProvider",
}


@pytest.mark.skipif(_chromium() is None, reason="chromium is not installed (apt-get install -y chromium)")
def test_the_verdict_names_the_precision_per_target_as_chromium_renders_it(tmp_path: Path) -> None:
    """Chromium's DOM of the page, as text: each target's verdict names the precision that ran there."""
    from PIL import Image, ImageStat

    page = tmp_path / "report.html"
    page.write_text(render_html(mixed_rows_report()))
    done = subprocess.run(_headless(tmp_path, "--dump-dom", page.as_uri()), capture_output=True, text=True,
                          timeout=120, check=False)
    assert "What to ship" in done.stdout, done.stderr[-2000:]
    block = done.stdout.split("<h2>What to ship</h2>", 1)[1].split("<h2>", 1)[0]
    cards = {target: html_text(card) for card in block.split('<div class="ship" data-target="')[1:]
             for target in [card.split('"', 1)[0]]}
    assert set(cards) == set(VERDICT_RAN)
    for target, ran in VERDICT_RAN.items():
        assert f"{target}: {ran}" in cards[target], cards[target]
    shot = tmp_path / "verdict.png"
    subprocess.run(_headless(tmp_path, f"--screenshot={shot}", "--window-size=1280,900", page.as_uri()),
                   capture_output=True, timeout=120, check=False)
    with Image.open(shot) as image:
        assert ImageStat.Stat(image.convert("L").crop((0, 0, 1280, 600))).stddev[0] > 20  # the verdict, not blank


def html_text(fragment: str) -> str:
    """The text a reader sees of an HTML fragment: tags dropped, entities decoded, spaces joined."""
    import html

    return re.sub(r"\s+", " ", html.unescape(re.sub(r"<[^>]+>", "", fragment))).strip()


@pytest.mark.slow
def test_a_real_run_writes_all_three_reports(tiny_recipe: Path, tmp_path: Path) -> None:
    from qdeploy.pipeline.recipe.loader import load_recipe_file
    from qdeploy.pipeline.run.runner import RunOptions, run_recipe

    out = tmp_path / "out"
    result = run_recipe(load_recipe_file(tiny_recipe), RunOptions(out_dir=out, show_progress=False))
    assert result.exit_code == 0, result.report["failures"]
    page = (out / "report.html").read_text()
    assert (out / "report.md").is_file() and (out / "report.json").is_file()
    profiled = [pair for pair in result.report["layers"]["pairs"] if pair["status"] == "ok"]  # one chart each
    assert external_references(page) == [] and page.count("<svg") == 2 + len(profiled)
    for variant in ("fp32", "fp16", "int8"):
        assert f"{variant}</td>" in page
    bench = result.report["benchmarks"][0]
    assert bench["status"] == "ok" and bench["timed_call"] and bench["settings"]
    assert bench["speedup_range"] is not None
