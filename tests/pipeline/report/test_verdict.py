"""The verdict per target (issue 18): what to ship, never a failed row, ties go to the smaller artifact;
unavailable targets collapse into one line; numbers printed to the precision they have."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from qdeploy.pipeline.report import render_markdown
from qdeploy.pipeline.report.format import fmt_cosine, fmt_ms, fmt_number, fmt_rate, fmt_snr, fmt_speedup
from qdeploy.pipeline.report.html import render_html
from qdeploy.pipeline.report.tables import matrix_lines
from qdeploy.pipeline.report.verdict import verdict_section
from qdeploy.pipeline.report.verdict_words import verdict_lines
from qdeploy.pipeline.report.view import tradeoff_points
from tests.helpers.reports import bench_row, check_row, rate_latency, synthetic_report


def _two_targets() -> dict[str, Any]:
    """fp32/fp16/int8 on ort:cpu and openvino:cpu, every row passing; int8 fastest by far on both."""
    report = copy.deepcopy(synthetic_report())
    report["failures"], report["gates"] = [], []
    report["artifacts"] = [a for a in report["artifacts"] if a["name"] in ("fp32", "fp16", "int8")]
    report["benchmarks"] = [row for row in report["benchmarks"] if row["variant"] in ("fp32", "fp16", "int8")]
    report["validation"] = [row for row in report["validation"] if row["variant"] in ("fp32", "fp16", "int8")]
    for row in report["validation"]:
        if row["status"] == "failed":
            row["status"], row["reason"] = "passed", ""
    for variant, p50, rounds in (("fp32", 8.0, [8.0, 8.2, 7.9, 8.1, 8.0]), ("fp16", 7.9, [7.9, 8.3, 7.8, 8.0, 8.1]),
                                 ("int8", 3.0, [3.0, 3.1, 2.9, 3.0, 3.2])):
        report["benchmarks"].append(bench_row(variant, "openvino:cpu", p50, rounds, speedup=8.0 / p50,
                                           speedup_range=[7.9 / p50, 8.2 / p50]))
        report["validation"].append(check_row(variant, "openvino:cpu", 0.999, 30.0))
    return report


def _target(report: dict[str, Any], target: str) -> dict[str, Any]:
    return verdict_section(report)["targets"][target]


def test_the_fastest_passing_artifact_is_shipped_per_target() -> None:
    report = _two_targets()
    ov = _target(report, "openvino:cpu")
    assert ov["status"] == "ship" and ov["variant"] == "int8" and ov["runner_up"] is None
    assert ov["speedup"] == pytest.approx(8.0 / 3.0) and ov["fidelity"]["cosine"] == 0.999
    # the intervals decided here ([7.9, 8.2] against int8's), and the line says so rather than "the rounds agree"
    assert ov["rejected"]["fp32"].endswith("slower: 8.00 ms against 3.00 ms (int8), the 95% intervals do not overlap")


def test_a_failed_fast_artifact_is_never_chosen() -> None:
    report = _two_targets()
    for row in report["validation"]:
        if (row["variant"], row["target"]) == ("int8", "openvino:cpu"):
            row["status"], row["reason"] = "failed", "cosine 0.5 < 0.98"
    ov = _target(report, "openvino:cpu")
    assert ov["variant"] != "int8" and ov["status"] == "ship"
    assert ov["rejected"]["int8"] == "validation failed: cosine 0.5 < 0.98"
    for status in ("error", "unavailable"):  # nor an errored or unavailable one
        for row in report["validation"]:
            if row["target"] == "openvino:cpu":
                row["status"] = status if row["variant"] == "int8" else "passed"
        assert _target(report, "openvino:cpu")["variant"] != "int8"


def test_a_failed_gate_or_a_failed_build_rules_an_artifact_out() -> None:
    report = _two_targets()
    report["gates"] = [{"variant": "int8", "target": "openvino:cpu", "metric": "cosine", "min": 0.9999,
                        "max": None, "batch_size": 1, "value": 0.999, "passed": False, "skipped": False, "reason": ""}]
    ov = _target(report, "openvino:cpu")
    assert ov["variant"] != "int8" and ov["rejected"]["int8"].startswith("gate failed: cosine 0.999")
    assert _target(report, "ort:cpu")["variant"] == "int8"  # a gate on another target does not count here
    report["gates"][0]["metric"] = "size_bytes"  # ... unless it is a size gate: the file is the same everywhere
    assert _target(report, "ort:cpu")["variant"] != "int8"
    report["gates"] = []
    report["failures"] = [{"variant": "int8", "stage": "quantize", "reason": "x", "kind": "stage"}]
    assert _target(report, "openvino:cpu")["rejected"]["int8"] == "failed to build in stage quantize"


def _tied_on_openvino() -> dict[str, Any]:
    """fp32 and int8 on openvino:cpu that the rounds cannot order (int8 a hair slower, some rounds faster)."""
    report = _two_targets()
    for row in report["benchmarks"]:
        if row["target"] == "openvino:cpu" and row["variant"] in ("fp32", "int8"):
            rounds = [5.0, 5.2, 4.9, 5.1, 5.0] if row["variant"] == "fp32" else [5.1, 5.1, 5.0, 5.0, 5.05]
            row["round_p50_ms"], row["latency_ms"]["p50"] = rounds, 5.0 if row["variant"] == "fp32" else 5.05
            row["latency_ms"]["ci95_p50"] = [4.9, 5.2] if row["variant"] == "fp32" else [5.0, 5.1]
    return report


def test_a_tie_goes_to_the_higher_fidelity_the_reference_first() -> None:
    report = _tied_on_openvino()
    for row in report["benchmarks"]:  # int8 now the faster by a hair, still within the noise
        if row["target"] == "openvino:cpu" and row["variant"] == "int8":
            row["latency_ms"]["p50"] = 4.95
    section = verdict_section(report)
    ov = section["targets"]["openvino:cpu"]
    assert section["tie_break"] == "fidelity"
    assert ov["variant"] == "fp32" and "the reference itself (ties go to fidelity" in ov["why"], ov["why"]
    assert ov["runner_up"]["variant"] == "int8" and ov["decided"] is True


def test_a_tie_picks_the_smaller_artifact_when_the_recipe_favours_size() -> None:
    report = _tied_on_openvino()
    ov = verdict_section(report, tie_break="size")["targets"]["openvino:cpu"]
    assert ov["variant"] == "int8" and "is smaller (0.500 MB against 2.00 MB)" in ov["why"]  # fp32 was faster
    assert ov["runner_up"]["variant"] == "fp32"
    lines = dict(verdict_lines(verdict_section(report, tie_break="size")))
    [headline] = [line for line in lines if line.startswith("openvino:cpu")]
    assert lines[headline][0].startswith("runner-up fp32: 5.00 ms")


def _timed_on_openvino(report: dict[str, Any],
                       **rows: tuple[list[float], float, list[float], dict[str, Any]]) -> None:
    """The named variants' openvino:cpu latency rows get these rounds, p50, 95% interval and other fields."""
    for row in report["benchmarks"]:
        if row["target"] == "openvino:cpu" and row["variant"] in rows:
            rounds, p50, interval, fields = rows[row["variant"]]
            row["round_p50_ms"] = rounds
            row["latency_ms"].update(p50=p50, ci95_p50=interval)
            row.update(fields)


def test_a_gap_of_medians_whose_intervals_do_not_overlap_is_never_a_tie() -> None:
    """One round in which fp16 happened to be faster must not make a 4.8x slower int8 its equal."""
    report = _two_targets()
    _timed_on_openvino(report, fp16=([1.39, 1.40, 1.38, 1.41, 7.0], 1.39, [1.38, 1.41], {}),
                       int8=([6.7, 6.6, 6.8, 6.7, 6.5], 6.70, [6.6, 6.8], {}))
    ov = verdict_section(report, tie_break="size")["targets"]["openvino:cpu"]
    assert ov["variant"] == "fp16" and ov["runner_up"] is None, ov
    assert ov["rejected"]["int8"].startswith("slower: 6.70 ms against 1.39 ms (fp16)")


def test_a_tie_on_a_busy_machine_is_undecided_and_says_why() -> None:
    report = _tied_on_openvino()
    busy = {"busy": True, "other_cores": 1.02, "cores": 2, "extra_rounds": 10, "extra_rounds_reason": "x"}
    for row in report["benchmarks"]:
        if row["target"] == "openvino:cpu":
            row["machine_load"] = busy
    section = verdict_section(report)
    ov = section["targets"]["openvino:cpu"]
    assert ov["decided"] is False and ov["variant"] == "fp32"
    assert ov["undecided"].startswith("machine busy: other processes used 1.02 of 2 cores while timing")
    assert "(10 extra)" in ov["undecided"] and "cannot tell int8 from fp32" in ov["undecided"]
    [headline] = [line for line, _ in verdict_lines(section) if line.startswith("openvino:cpu")]
    assert headline.startswith("openvino:cpu: undecided: machine busy") and "meanwhile ship fp32" in headline
    ort = section["targets"]["ort:cpu"]  # a quiet target, and a clear winner on a busy one, stay decided
    assert ort["decided"] is True
    for row in report["benchmarks"]:
        if row["target"] == "openvino:cpu" and row["variant"] == "int8":
            row["round_p50_ms"], row["latency_ms"]["p50"], row["latency_ms"]["ci95_p50"] = [2.0] * 5, 2.0, [2, 2]
    assert verdict_section(report)["targets"]["openvino:cpu"]["decided"] is True


def test_rounds_that_all_agree_break_the_tie() -> None:
    report = _two_targets()
    for row in report["benchmarks"]:  # int8 a hair slower than fp32, but in every round
        if row["target"] == "openvino:cpu" and row["variant"] in ("fp32", "int8"):
            rounds = [5.0, 5.2, 4.9, 5.1, 5.0] if row["variant"] == "fp32" else [5.01, 5.21, 4.91, 5.11, 5.01]
            row["round_p50_ms"], row["latency_ms"]["p50"] = rounds, rounds[0]
    ov = _target(report, "openvino:cpu")
    assert ov["variant"] == "fp32" and ov["runner_up"] is None
    assert ov["rejected"]["int8"].endswith("(fp32), behind in 5 of 5 paired rounds (sign test, p = 0.031)")


def test_a_rejection_names_the_sign_test_that_decided_it() -> None:
    """int8 a hair slower in 9 of 10 paired rounds, the intervals overlapping: the sign test decided, and says so."""
    fp32 = [5.0, 5.2, 4.9, 5.1, 5.0, 5.3, 4.8, 5.0, 5.1, 5.2]
    report = _two_targets()
    _timed_on_openvino(report, fp32=(fp32, 5.05, [4.9, 5.2], {}),
                       int8=([r + 0.02 for r in fp32[:9]] + [5.0], 5.07, [4.92, 5.22], {}))
    rejected = _target(report, "openvino:cpu")["rejected"]["int8"]
    assert rejected.endswith("(fp32), behind in 9 of 10 paired rounds (sign test, p = 0.011)"), rejected


def test_artifacts_timed_in_different_session_groups_are_ranked_by_their_samples_not_round_by_round() -> None:
    """A large model's sessions did not fit in memory at once: int8 was timed alone, after the others, in 5 rounds
    (one a hiccup), fp32 in 11.  Pairing the first 5 rounds of each by index called a 1.6x gap a tie and shipped
    the slower fp32 for its fidelity; as two samples of rounds, int8 is apart."""
    report = _two_targets()
    _timed_on_openvino(report, int8=([1.86, 1.77, 3.47, 1.96, 1.85], 1.91, [1.76, 4.61], {"round_group": 1}),
                       fp32=([3.77, 2.92, 2.87, 2.89, 2.89, 2.87, 3.26, 3.06, 3.36, 3.22, 3.19], 3.00, [2.91, 3.24],
                             {"round_group": 0}))
    ov = verdict_section(report, tie_break="fidelity")["targets"]["openvino:cpu"]
    assert ov["variant"] == "int8", ov
    assert ov["rejected"]["fp32"].endswith("its 11 rounds rank above the other's 5, timed in another group (rank "
                                           "test, p = 0.026)"), ov["rejected"]["fp32"]
    for row in report["benchmarks"]:  # the same rounds, measured side by side: one round in five disagrees
        row.pop("round_group", None)
    assert verdict_section(report, tie_break="fidelity")["targets"]["openvino:cpu"]["variant"] == "fp32"


def test_groups_are_compared_through_the_anchor_timed_again_in_each() -> None:
    """luscinia: int8 (the same float32 graph) in a later, quieter group "1.83x" faster than fp32 by medians taken
    minutes apart; beside it, fp32 timed again was as fast: a tie, and the reference ships."""
    report = _two_targets()
    _timed_on_openvino(report, fp32=([1.9, 1.85, 1.95, 1.88, 1.92], 1.9, [1.85, 1.95], {"round_group": 0}),
                       int8=([1.03, 1.0, 1.05, 1.02, 1.04], 1.03, [1.0, 1.05], {
                           "round_group": 1, "anchor": {"variant": "fp32", "round_p50_ms": [1.04, 1.01, 1.05, 1.01,
                                                                                               1.03]}}))
    report["benchmarks"] = [row for row in report["benchmarks"]  # the other artifacts were not timed there
                            if row["target"] != "openvino:cpu" or row["variant"] in ("fp32", "int8")]
    ov = verdict_section(report, tie_break="fidelity")["targets"]["openvino:cpu"]
    assert ov["variant"] == "fp32"
    assert ov["runner_up"]["variant"] == "int8" and "within the benchmark's noise (1.03 ms, 1.00x the first " \
        "artifact's time in its own rounds)" in ov["why"], ov["why"]  # what was compared, not 1.03 ms against 1.90
    for row in report["benchmarks"]:
        row.pop("anchor", None)  # without fp32's second timing: the drift reads as int8's speed
    assert verdict_section(report, tie_break="fidelity")["targets"]["openvino:cpu"]["variant"] == "int8"


def test_nothing_to_ship_and_benchmarks_off() -> None:
    report = _two_targets()
    for row in report["validation"]:
        row["status"] = "failed" if row["target"] == "ort:cpu" and row["metrics"] else row["status"]
    assert _target(report, "ort:cpu")["status"] == "none"
    report["benchmarks"] = []
    section = verdict_section(report, tie_break="size")
    assert section["by"] == "size" and section["targets"]["openvino:cpu"]["variant"] == "int8"  # the smallest
    assert "not ranked by speed" in section["targets"]["openvino:cpu"]["why"]
    assert verdict_section(report)["targets"]["openvino:cpu"]["variant"] == "int8"  # whatever the tie rule


def test_throughput_groups_are_compared_through_the_anchor_too() -> None:
    """As latency: a later, quieter group's int8 reads 2x the rate of fp32's earlier rounds; fp32 timed again beside
    it read the same: a tie, and the reference ships."""
    report = _two_targets()
    report["benchmarks"] = []
    report["throughput"] = [
        {"variant": v, "target": "openvino:cpu", "batch_size": 1, "status": "ok", "inferences_per_s": ips,
         "round_inferences_per_s": rounds, "requests_in_flight": 2, "latency_ms": rate_latency(4.0), "round_group": g,
         **({"anchor": {"variant": "fp32", "round_inferences_per_s": [401, 399, 402, 398, 400]}} if g else {})}
        for v, ips, rounds, g in (("fp32", 200.0, [200, 199, 201, 198, 202], 0),
                                  ("int8", 400.0, [400, 401, 399, 402, 398], 1))]
    assert verdict_section(report, tie_break="fidelity")["targets"]["openvino:cpu"]["variant"] == "fp32"
    for row in report["throughput"]:
        row.pop("anchor", None)
    assert verdict_section(report, tie_break="fidelity")["targets"]["openvino:cpu"]["variant"] == "int8"


def test_throughput_ranks_when_only_throughput_was_measured() -> None:
    report = _two_targets()
    report["benchmarks"] = []
    report["throughput"] = [
        {"variant": v, "target": "openvino:cpu", "batch_size": 1, "status": "ok", "inferences_per_s": ips,
         "round_inferences_per_s": rounds, "requests_in_flight": 2, "latency_ms": rate_latency(4.0)}
        for v, ips, rounds in (("fp32", 200.0, [200, 198, 201]), ("int8", 450.0, [450, 440, 460]),
                               ("fp16", 199.0, [199, 210, 190]))]
    section = verdict_section(report)
    ov = section["targets"]["openvino:cpu"]
    assert section["by"] == "throughput" and ov["variant"] == "int8" and ov["inferences_per_s"] == 450.0
    assert "lower throughput: 200 inf/s against 450 inf/s" in ov["rejected"]["fp32"]
    assert section["targets"]["ort:cpu"]["status"] == "none"  # nothing measured there


def test_unavailable_targets_collapse_into_one_line() -> None:
    report = synthetic_report()
    report["validation"].append({"variant": "fp16", "target": "openvino:gpu", "status": "unavailable",
                                 "reason": "target openvino:gpu requested; this machine's OpenVINO has devices CPU",
                                 "metrics": {}})
    section = verdict_section(report)
    assert list(section["unavailable"]) == ["ort:cuda", "openvino:gpu"] and "ort:cuda" not in section["targets"]
    table = matrix_lines(report)
    assert not any("| ort:cuda |" in line for line in table)
    [line] = [line for line in table if "ort:cuda" in line]
    assert line.startswith("Not available on this machine: ort:cuda, openvino:gpu (")
    text = render_markdown(report)
    assert text.count("(unavailable)") == 0 and "## What to ship" in text
    assert text.index("## What to ship") < text.index("## Gates")
    page = render_html(report)
    assert page.index("<h2>What to ship</h2>") < page.index("<h2>Gates</h2>")
    assert "<tr class=\"group\"><td colspan=\"15\">ort:cuda" not in page and "Not available on this machine" in page


def test_numbers_are_printed_to_sensible_precision() -> None:
    assert fmt_speedup(1.00048) == "1.00x" and fmt_speedup(2.0249) == "2.02x"
    assert fmt_speedup(1.05, [0.78, 1.09]) == "≈1x (0.78–1.09)"
    assert fmt_ms(6.8) == "6.80 ms" and fmt_ms(10.345) == "10.3 ms" and fmt_ms(1234.4) == "1234 ms"
    assert fmt_ms(0.51234) == "0.512 ms" and fmt_number(123.4) == "123"
    assert fmt_rate(470.4) == "470 inf/s"
    assert fmt_cosine(0.99819) == "0.998" and fmt_cosine(0.9999971) == "0.9999971" and fmt_cosine(1.0) == "1"
    assert fmt_cosine(0.99999999999) == "1 − 1e-11"
    assert fmt_snr(24.27) == "24.3 dB" and fmt_snr(200.0) == "identical outputs"
    text = render_markdown(_two_targets())
    assert "1.00048" not in text and "x ≈" not in text


def test_the_snr_cap_does_not_flatten_the_fidelity_axis() -> None:
    points, label = tradeoff_points(_two_targets())
    fp32 = next(p for p in points if p.variant == "fp32" and p.target == "ort:cpu")
    assert label.startswith("SNR") and fp32.capped and fp32.fidelity == pytest.approx(52.0 + 10.0)
    # one front per target: int8 on ort:cpu is on its front even though openvino:cpu has a faster point
    fronts = {(p.variant, p.target) for p in points if p.on_front}
    assert ("int8", "ort:cpu") in fronts and ("int8", "openvino:cpu") in fronts


@pytest.mark.slow
def test_a_run_in_both_modes_reports_latency_throughput_and_the_verdict(tiny_recipe: Path, tmp_path: Path) -> None:
    from qdeploy.pipeline.recipe.loader import load_recipe_file
    from qdeploy.pipeline.run.runner import RunOptions, run_recipe

    recipe_path = tiny_recipe.with_name("both.yaml")
    text = tiny_recipe.read_text().replace("targets: [ort:cpu]", "targets: [ort:cpu, ort:cuda]")
    recipe_path.write_text(text.replace(
        "benchmark: {batch_sizes: [1], warmup: 1, iterations: 5, rounds: 1, busy_seconds: 0}",
        "benchmark: {batch_sizes: [1], warmup: 1, iterations: 6, rounds: 3, mode: both, "
        "throughput: {seconds: 0.3, warmup_seconds: 0.05}}"))
    result = run_recipe(load_recipe_file(recipe_path), RunOptions(out_dir=tmp_path / "out", show_progress=False))
    report = result.report
    assert result.exit_code == 0, (report["failures"], report["unmeasured"])
    assert {row.get("mode") for row in report["throughput"]} == {"throughput"}
    assert all(row.get("mode") != "throughput" for row in report["benchmarks"])
    ok = [row for row in report["throughput"] if row["status"] == "ok"]
    assert {row["variant"] for row in ok} == {"fp32", "fp16", "int8"} and all(r["inferences_per_s"] > 0 for r in ok)
    pick = report["verdict"]["targets"]["ort:cpu"]
    assert pick["status"] == "ship" and pick["inferences_per_s"] > 0 and pick["requests_in_flight"] >= 1
    assert list(report["verdict"]["unavailable"]) == ["ort:cuda"]
    text = (tmp_path / "out" / "report.md").read_text()
    assert "## What to ship" in text and "## Throughput" in text and "| ort:cuda |" not in text


def test_throughput_rows_are_tabled_in_markdown_and_html() -> None:
    report = _two_targets()
    report["throughput"] = [
        {"variant": "fp32", "target": "openvino:cpu", "batch_size": 1, "status": "ok", "mode": "throughput",
         "inferences_per_s": 187.04, "round_inferences_per_s": [187.0], "requests_in_flight": 2, "streams": 2,
         "threads_per_request": 1, "latency_ms": rate_latency(5.333, 9.1), "speedup": 1.0,
         "speedup_range": [1.0, 1.0], "call": "AsyncInferQueue", "settings": {"PERFORMANCE_HINT": "THROUGHPUT"}},
        {"variant": "int8", "target": "ort:cuda", "batch_size": 1, "status": "unavailable", "mode": "throughput",
         "reason": "no CUDA", "inferences_per_s": None}]
    text = render_markdown(report)
    assert "| fp32 | openvino:cpu | 1 | 187 | 1.00x | 2 | 2 × 1 | 5.33 | 9.10 | ok |" in text
    assert "- openvino:cpu: AsyncInferQueue; PERFORMANCE_HINT=THROUGHPUT" in text and "int8 | ort:cuda" not in text
    page = render_html(report)
    assert "<h2>Throughput, many requests in flight</h2>" in page and "2 × 1" in page


def _slower_than_float_on_openvino() -> dict[str, Any]:
    """On openvino:cpu the fp32 reference fails a gate, and int8 (the smallest) and fp16 tie with each other but
    every round measured both slower than fp32 (an elementwise model: nothing for int8 kernels to speed up)."""
    report = _two_targets()
    report["benchmarks"] = [row for row in report["benchmarks"] if row["target"] != "openvino:cpu"]
    for variant, p50, rounds, spread in (("fp32", 8.0, [8.0, 8.1, 7.9, 8.0, 8.2], [1.0, 1.0]),
                                         ("fp16", 10.1, [10.1, 10.3, 10.0, 9.9, 10.2], [0.77, 0.81]),
                                         ("int8", 10.0, [10.0, 10.2, 10.1, 10.0, 10.3], [0.78, 0.82])):
        report["benchmarks"].append(bench_row(variant, "openvino:cpu", p50, rounds, speedup=8.0 / p50,
                                              speedup_range=spread))
    report["gates"] = [{"variant": "fp32", "target": "openvino:cpu", "metric": "latency_ms", "min": None, "max": 5.0,
                        "batch_size": 1, "value": 8.0, "passed": False, "skipped": False, "reason": ""}]
    return report


def test_an_artifact_slower_than_float_in_every_round_is_never_recommended() -> None:
    """Before, the tie between int8 and fp16 went to the smaller int8: an artifact 0.8x the float model's speed
    was recommended for deployment on that target."""
    verdict = _target(_slower_than_float_on_openvino(), "openvino:cpu")
    assert verdict["status"] == "none" and verdict["variant"] is None
    for variant in ("int8", "fp16"):
        reason = verdict["rejected"][variant]
        assert reason.startswith("slower than the float reference fp32 on this target: 0.")
        assert reason.endswith("x in every round; not recommended here")
    lines = dict(verdict_lines(verdict_section(_slower_than_float_on_openvino())))
    details = next(detail for headline, detail in lines.items() if headline.startswith("openvino:cpu"))
    assert any("not int8: slower than the float reference fp32" in line for line in details)


def test_a_converted_artifact_the_rounds_cannot_tell_from_float_stays_a_candidate() -> None:
    report = _slower_than_float_on_openvino()
    for row in report["benchmarks"]:
        if row["target"] == "openvino:cpu" and row["variant"] == "int8":
            row["speedup_range"] = [0.95, 1.03]  # some round had it as fast as fp32
    assert _target(report, "openvino:cpu")["variant"] == "int8"


def test_the_float32_file_at_the_device_default_ships_where_int8_does_not_beat_it() -> None:
    """On a bf16 CPU the fp32 file at OpenVINO's default is what a user deploys without quantizing: an int8 no
    faster than it is not worth shipping, and the verdict says so in words."""
    report = _two_targets()
    report["validation"].append(check_row("fp32@default", "openvino:cpu", 0.9998, 36.0))
    report["benchmarks"].append(bench_row("fp32@default", "openvino:cpu", 2.0, [2.0, 1.9, 2.1, 2.0, 2.0],
                                          speedup=4.0, speedup_range=[3.9, 4.2]))
    ov = verdict_section(report)["targets"]["openvino:cpu"]
    assert ov["variant"] == "fp32@default", ov
    assert ov["why"].startswith("the float32 model as the device runs it by default, no quantization needed")
    assert ov["size_bytes"] == next(a["size_bytes"] for a in report["artifacts"] if a["name"] == "fp32")
    assert ov["rejected"]["int8"].startswith("slower: 3.00 ms against 2.00 ms (fp32@default)")
    assert "fp32@default" not in verdict_section(report)["targets"]["ort:cpu"]["rejected"]  # OpenVINO's row only
