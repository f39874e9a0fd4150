"""`qdeploy explain RUN` (issue 31): the layers section of a finished run in the terminal; bad input exits 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from qdeploy.cli import app
from tests.helpers.layers_report import layers_section
from tests.helpers.models import tiny_cnn, write_recipe
from tests.helpers.reports import synthetic_report


def _invoke(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, list(args))
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result.exit_code, result.stdout, result.stderr


@pytest.fixture
def run_folder(tmp_path: Path) -> Path:
    (tmp_path / "report.json").write_text(json.dumps({**synthetic_report(), "layers": layers_section()}))
    return tmp_path


def test_explain_prints_the_pair_and_its_top_layers(run_folder: Path) -> None:
    code, out, _ = _invoke("explain", str(run_folder), "--top", "1")
    assert code == 0
    assert "int8 on ort:cpu (what the verdict ships)" in out and "most time (top 1 of 4 layers):" in out
    assert "int8 kernels: 90% of MACs, 80% of time on ort:cpu" in out


@pytest.mark.parametrize(("args", "needle"), [
    (("--variant", "nope"), "variant 'nope' is not in this run"),
    (("--target", "ort:nope"), "target 'ort:nope' is not in this run"),
    (("--top", "0"), "--top 0"),
])
def test_explain_refuses_what_the_run_does_not_have(run_folder: Path, args: tuple[str, ...], needle: str) -> None:
    code, _, err = _invoke("explain", str(run_folder), *args)
    assert code == 2 and needle in err and "Traceback" not in err, err


def test_explain_on_a_run_without_the_section_says_how_to_get_it(tmp_path: Path) -> None:
    (tmp_path / "report.json").write_text(json.dumps(synthetic_report()))
    code, _, err = _invoke("explain", str(tmp_path))
    assert code == 2 and "report.layers: auto or full" in err


@pytest.mark.slow
def test_explain_on_a_real_run(tmp_path: Path) -> None:
    """A whole run of the tiny CNN (fp32 and int8 on ort:cpu and openvino:cpu, every pair profiled)."""
    import onnx

    onnx.save(tiny_cnn(), tmp_path / "tiny.onnx")
    recipe = write_recipe(tmp_path, """
        name: tiny-layers
        model: {onnx: tiny.onnx}
        data: {calib: {reader: random, samples: 8, seed: 1}}
        variants:
          fp32: [simplify]
          int8: [simplify, {quantize: {mode: ptq, calibration: {data: calib}}}]
        targets: [ort:cpu, openvino:cpu]
        validate: {reference: fp32, samples: 2}
        benchmark: {batch_sizes: [1], warmup: 1, iterations: 3, rounds: 1}
        report: {layers: full, formats: [json, md, html]}
        """)
    out = tmp_path / "out"
    code, _, err = _invoke("run", str(recipe), "--out", str(out), "-q")
    report = json.loads((out / "report.json").read_text())
    section = report["layers"]
    assert section["mode"] == "full" and section["seconds"] > 0, err
    pairs = {(p["variant"], p["target"]): p for p in section["pairs"]}
    int8_ov = next(p for (v, t), p in pairs.items() if v.startswith("int8") and t == "openvino:cpu")
    conv = next(r for r in int8_ov["rows"] if r["op"] == "Convolution")
    assert conv["precision"] == "int8" and "conv" in conv["nodes"]
    code, text, err = _invoke("explain", str(out), "--target", "openvino:cpu")
    assert code == 0 and "int8 kernels:" in text and "most error added" in text, err
    assert "## Layers" in (out / "report.md").read_text()
    assert (out / "report.html").read_text().count('<table class="sorted') == 3 * len(section["pairs"])
