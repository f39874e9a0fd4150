"""Every statement of report.md, report.html and report.json is derived from the rows it describes (issue 29).

The fixture is a real demo run's report.json whose rows are made to differ per target (tests/helpers/demo_report.py):
what ran (precision, provider, kernels), the measurement plan, the package written.  Each format must say, per
target, what ran for the artifact it ships, and never state one row's settings of another.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from qdeploy.pipeline.report import render_markdown, write_reports
from qdeploy.pipeline.report.format import fmt_snr_cell
from qdeploy.pipeline.report.html import render_html
from qdeploy.pipeline.report.verdict import verdict_section
from qdeploy.pipeline.report.verdict_words import verdict_lines
from tests.helpers.demo_report import demo_report, mixed_rows_report

RAN = {  # target -> (variant shipped, how it ran, the package the run wrote of it)
    "ort:cpu": ("fp16", "fp16 artifact, but onnxruntime ran all 13 of its kernels in float32 on CPUExecutionProvider",
                "package packages/ort-cpu-fp16 (checked)"),
    "openvino:cpu": ("int8", "int8 artifact with float parts at bf16 (device default) on OpenVINO CPU",
                     "package packages/openvino-cpu-int8 (checked)"),
    "ort:cuda": ("fp16", "fp16 artifact, onnxruntime ran 11 fp16 + 2 fp32 kernels on CUDAExecutionProvider "
                 "(11 kernels) + CPUExecutionProvider (2 kernels)", "package packages/ort-cuda-fp16 (checked)"),
}


def test_each_format_says_per_target_what_ran_and_the_package(tmp_path: Path) -> None:
    written = write_reports(mixed_rows_report(), tmp_path, ["json", "md", "html"])
    assert [path.name for path in written] == ["report.json", "report.md", "report.html"]
    verdict = json.loads((tmp_path / "report.json").read_text())["verdict"]["targets"]
    text = (tmp_path / "report.md").read_text()
    page = (tmp_path / "report.html").read_text()
    for target, (variant, ran, package) in RAN.items():
        [line] = [line for line in text.splitlines() if line.startswith(f"- **{target}**: ")]
        assert line.startswith(f"- **{target}**: ship **{variant}** ({ran}") and line.endswith(package), line
        card = page.split(f'<div class="ship" data-target="{target}">', 1)[1].split('<div class="ship', 1)[0]
        assert f"{variant}</strong><span class=\"ran\"> ({ran}" in card and package in card
        assert verdict[target]["variant"] == variant
    assert verdict["ort:cpu"]["execution"] | {"providers": None} == {
        "precision": "fp16", "ran": "fp32 kernels", "runtime": "onnxruntime", "providers": None,
        "kernels": {"FP32": 13}, "float32_only": True}
    assert verdict["openvino:cpu"]["execution"]["ran"] == "bf16 (device default)"
    assert verdict["openvino:cpu"]["execution"]["float32_only"] is False
    assert verdict["ort:cuda"]["execution"]["provider_kernels"] == {"CUDAExecutionProvider": 11,
                                                                    "CPUExecutionProvider": 2}
    runner = next(line for line in text.splitlines() if "runner-up fp32" in line)  # its own row, not the pick's
    assert "(fp32 artifact, onnxruntime ran 12 fp32 kernels on CPUExecutionProvider)" in runner


def test_how_latency_was_measured_is_said_of_the_rows_that_share_it() -> None:
    text = render_markdown(mixed_rows_report())
    measured = text.split("## How latency was measured", 1)[1].split("\n## ", 1)[0].splitlines()
    openvino = [line for line in measured if line.startswith("- openvino:cpu")]
    assert "- openvino:cpu, fp32, fp16: sync, one request at a time; warm-up 10 runs; measured 100 runs in 5 " \
           "interleaved rounds; threads runtime default" in openvino
    assert "- openvino:cpu, int8: sync, one request at a time; warm-up 10 runs; measured 50 runs in 5 interleaved " \
           "rounds; threads 1" in openvino
    assert not any("INFERENCE_PRECISION_HINT=" in line for line in openvino)  # differs per row: never shared
    assert "- openvino:cpu: INFERENCE_PRECISION_HINT per row: fp32 f32, fp16 bf16, int8 bf16" in openvino
    assert "- openvino:cpu: inference precision that ran, per row: fp32: f32 (pinned); fp16: bf16 (device " \
           "default); int8: bf16 (device default)" in openvino
    assert "- ort:cuda: inference precision that ran, per row: fp32: fp32 kernels; fp16: fp16+fp32 kernels" in measured
    page = render_html(mixed_rows_report())
    assert "openvino:cpu, int8: sync, one request at a time; warm-up 10 runs; measured 50 runs" in page


def test_a_size_difference_below_the_printed_precision_is_no_reason() -> None:
    """fp16 and fp32 tie on ort:cpu; fp16 300 bytes smaller prints as the same 1.89 MB: the simpler fp32 ships."""
    report = mixed_rows_report()
    sizes = {artifact["name"]: artifact for artifact in report["artifacts"]}
    sizes["fp16"]["size_bytes"] = sizes["fp32"]["size_bytes"] - 300
    del report["verdict"]
    section = verdict_section(report, tie_break="size")
    ort = section["targets"]["ort:cpu"]
    assert ort["variant"] == "fp32", ort["why"]
    assert "the same size to the printed precision (1.89 MB) and simpler (2 stages against 3)" in ort["why"]
    for headline, details in verdict_lines(section):
        assert not re.search(r"smaller \(([\d.]+ MB) against \1\)", " ".join([headline, *details])), headline


def test_two_variants_of_one_file_ship_the_first_and_say_so() -> None:
    report = mixed_rows_report()
    sizes = {artifact["name"]: artifact for artifact in report["artifacts"]}
    sizes["fp16"].update(sha256=sizes["fp32"]["sha256"], size_bytes=sizes["fp32"]["size_bytes"])
    del report["verdict"]
    ort = verdict_section(report)["targets"]["ort:cpu"]
    assert ort["variant"] == "fp32" and "the same file as fp16 (same sha256)" in ort["why"]


def test_the_noise_floor_is_said_in_words() -> None:
    text = render_markdown(demo_report())
    [line] = [line for line in text.splitlines() if line.startswith("- noise floor of the reference")]
    assert line == ("- noise floor of the reference: fp32 on openvino:cpu against fp32 on ort:cpu: cosine 1 − 6e-13, "
                    "SNR 118.9 dB, max abs err 8.11e-06, mean abs err 1.88e-06 (passed)")
    assert "{" not in line and "'" not in line
    page = render_html(demo_report())
    assert "fp32 on openvino:cpu against fp32 on ort:cpu: cosine 1 − 6e-13" in page


def test_the_reports_list_the_packages_the_run_wrote() -> None:
    report = demo_report()
    text = render_markdown(report)
    packages = text.split("## Packages", 1)[1].split("\n## ", 1)[0]
    assert "2 packages written, chosen by the verdict, one per target:" in packages
    assert "`/runs/demo/packages/ort-cpu-int8`: int8 for ort:cpu; checked against 4 reference samples" in packages
    assert "`/runs/demo/packages/openvino-cpu-int8`: int8 for openvino:cpu" in packages
    page = render_html(report)
    assert "<h2>Packages</h2>" in page and "/runs/demo/packages/openvino-cpu-int8: int8 for openvino:cpu" in page
    report["packages"] = {"enabled": False, "written": [], "failed": []}
    assert "report.packages.enabled is false" in render_markdown(report)


def test_artifact_sizes_print_as_the_verdict_prints_them() -> None:
    text = render_markdown(demo_report())
    assert "0.498 MB" in text.split("## Artifacts", 1)[1] and "0.50 MB" not in text


def test_the_snr_cap_reads_alike_in_the_reports_and_the_terminal() -> None:
    text = render_markdown(demo_report())
    fp32 = next(line for line in text.splitlines() if line.startswith("| fp32 | ort:cpu |"))
    assert f"| {fmt_snr_cell(200.0)} |" in fp32 and fmt_snr_cell(200.0) == "identical outputs"
    assert fmt_snr_cell(25.21) == "25.2" and fmt_snr_cell(None) == "–"
