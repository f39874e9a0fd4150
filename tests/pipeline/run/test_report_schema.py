"""report.json of the demo keeps its keys, and its artifacts keep their cache keys (issue 30: typed stage findings
and configs passed as models must change neither).

The stored demo report (tests/pipeline/demo_report.json) is the baseline.  Key paths merge list items
(``artifacts[].sha256``); maps keyed by names the model or the machine decides (op types, targets, providers,
input names) count as one key ``*``, so the schema, not the demo's graph, is compared.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from qdeploy.core.report import Report, report_schema
from qdeploy.pipeline.recipe.loader import load_recipe_file
from qdeploy.pipeline.run.runner import RunOptions, run_recipe
from tests.helpers.demo_report import demo_report
from tests.helpers.models import DEMO_RECIPE

pytestmark = pytest.mark.slow

NAMED_MAPS = frozenset({"input_shapes", "shapes", "applied", "refused", "rejected", "versions", "flags", "folded",
                        "added", "removed", "initializers", "node_counts", "op_types", "precisions", "kernels",
                        "quantized_nodes", "nodes_before", "nodes_after", "int8_kernels", "compute_layers",
                        "int8_layers", "float_compute_kernels", "targets", "unavailable", "unreadable", "settings",
                        "by_precision", "decisions"})
"""Maps whose keys are names of things (ops, targets, inputs, settings of a runtime), not report fields."""
TIMING_DEPENDENT = ("verdict.targets.*.runner_up.", "layers.pairs[].summary.slow.")
"""Present only when two artifacts time within the benchmark's noise."""
ADDED_SINCE_FIXTURE = frozenset({
    # issues 28-29 (before issue 30): checksums of published files, recipe content hashes, throughput rows, the
    # verdict's throughput figures and execution summary
    "artifacts[].sidecar_sha256", "packages.written[].manifest_sha256", "recipe.content", "recipe.content.data",
    "recipe.content.model", "recipe.content.validate",
    *(f"throughput[].{key}" for key in (
        "batch_size", "call", "inferences", "inferences_per_s", "latency_ms", "latency_ms.max", "latency_ms.mean",
        "latency_ms.min", "latency_ms.p50", "latency_ms.p90", "latency_ms.p99", "mode", "notes", "precision_hint",
        "reason", "requests_in_flight", "requests_run", "round_inferences_per_s", "round_spread", "seconds",
        "settings", "settings.*", "speedup", "speedup_range", "status", "streams", "target", "threads_per_request",
        "variant")),
    *(f"verdict.targets.*.{key}" for key in (
        "execution", "execution.float32_only", "execution.kernels", "execution.kernels.*", "execution.precision",
        "execution.providers", "execution.ran", "execution.runtime", "inferences_per_s", "latency_at_load_ms",
        "requests_in_flight", "throughput_speedup")),
})
_LAYER_ROW = ("compute_op", "cosine", "decision", "error_node", "exec", "float_reason", "layer", "macs", "nodes",
              "nonfinite", "nonfinite_born", "op", "precision", "qdq_nodes", "snr_db", "snr_drop_db", "through_graph",
              "time_ms")
ADDED_SINCE_FIXTURE |= frozenset({  # issue 31: the layers section (docs/report.md)
    "layers", "layers.mode", "layers.pairs", "layers.seconds", "layers.top",
    *(f"layers.pairs[].{key}" for key in (
        "decisions", "decisions.*", "exposure", "exposure.changed", "exposure.max_output_difference", "exposure.note",
        "notes", "pinned_precision", "precision", "profile", "profile.benchmark_p50_ms", "profile.profiled_ms",
        "profile.runs", "rows_total", "samples", "seconds", "status", "summary", "summary.by_precision",
        "summary.by_precision.*", "summary.lines", "summary.macs", "summary.slow", "summary.time_ms", "target",
        "timeline", "timeline.layer", "timeline.precision", "timeline.snr_db", "timeline.time_ms", "top_error",
        "top_time", "unclaimed_nodes", "variant", "why")),
    *(f"layers.pairs[].summary.by_precision.*.{key}" for key in ("layers", "macs", "macs_share", "time_ms",
                                                                  "time_share")),
    *(f"layers.pairs[].{top}[].{key}" for top in ("top_time", "top_error") for key in _LAYER_ROW)
})
# issue 32: the budget's time limit and latency-aware reverting (a ptq config dumps every field)
ADDED_SINCE_FIXTURE |= frozenset(f"artifacts[].lineage[].config.budget.{key}" for key in ("max_seconds",
                                                                                         "weigh_latency"))
# issue 34: per_runtime auto splits the demo's int8; each build's row says whether the placements differ
ADDED_SINCE_FIXTURE |= frozenset(f"artifacts[].per_runtime{key}" for key in (
    "", ".graphs", ".differs_at", ".nodes", ".decision_seconds", ".note"))
# the simplify check's noise floor, the guard's other runtimes, how busy the machine was while timing and the time
# bounds of the default measurement, speedups against the float32 model at the device default, the verdict's tie
# rule and whether it decided
ADDED_SINCE_FIXTURE |= frozenset({
    "artifacts[].lineage[].config.check_noise_factor",
    *(f"artifacts[].lineage[].findings.check.noise_floor{key}" for key in ("", ".measured", ".why")),
    *(f"artifacts[].lineage[].findings.guard.other_runtimes{key}" for key in ("", ".openvino")),
    "benchmarks[].machine_load", *(f"benchmarks[].machine_load.{key}" for key in (
        "busy", "cores", "extra_rounds", "extra_rounds_reason", "involuntary_switches_per_s", "loadavg_after",
        "loadavg_before", "other_cores", "seconds")),
    *(f"benchmarks[].measure.{key}" for key in ("busy_seconds", "timed_seconds_cap", "warmup_seconds_cap")),
    "benchmarks[].speedup_vs_default", "benchmarks[].speedup_vs_default_range",
    *(f"verdict.targets.*.{key}" for key in ("decided", "speedup_vs_default", "speedup_vs_default_range",
                                             "undecided")),
    "verdict.tie_break",
    "validation[].outputs[].kl"})  # KL of per-token scores (language models); null on other outputs
# issue 43: how signed activations are quantized (OpenVINO's int8 without input zero points), the 7-bit margin
ADDED_SINCE_FIXTURE |= frozenset({
    "artifacts[].lineage[].config.signed_activations", "artifacts[].lineage[].findings.reduce_range.margin_db",
    *(f"artifacts[].lineage[].findings.signed_activations{key}" for key in (
        "", ".setting", ".symmetric", ".why", ".compared_on_samples", ".measured", ".measured.*",
        ".measured.*.snr_db", ".measured.*.cosine"))})
# issue 43: the demo's OpenVINO graph measures its lopsided signed activations on int8 beside 7-bit ones
ADDED_SINCE_FIXTURE |= frozenset(f"artifacts[].lineage[].findings.signed_activations.measured.{form}{key}"
                                 for form in ("all", "centred") for key in ("", ".snr_db", ".cosine"))
# issue 43: the convolutions the graph for ONNX Runtime routes to its AMX GEMM (on AMX CPUs only)
ADDED_SINCE_FIXTURE |= frozenset(f"artifacts[].lineage[].findings.ort_conv_gemm{key}" for key in (
    "", ".convs", ".names", ".why"))
# unseen models, round five: fp16's accumulating scatters kept float32; ptq's nodes left float for +-Inf/NaN
ADDED_SINCE_FIXTURE |= frozenset(f"artifacts[].lineage[].findings.{key}" for key in (
    "scatter_reduction_float32_nodes", "nonfinite_float", "nonfinite_float.*"))
# unseen models, round seven: how many nodes of an fp16 artifact compute in float16 (0: the float32 model)
ADDED_SINCE_FIXTURE |= frozenset({"artifacts[].lineage[].findings.float16_compute_nodes"})
"""Key paths the current report has and the stored fixture (an earlier run) lacks; nothing else may be new."""
REMOVED_SINCE_FIXTURE = frozenset(f"artifacts[].lineage[].config.{key}" for key in (
    # issue 30: one config model per quantize mode; a ptq step's config dumps ptq's fields only
    "accuracy_level", "bits", "embeddings", "group_size", "lm_head", "nncf_model_type", "weight_format"))
"""Key paths the fixture has and the current report may lack; nothing else may go."""


def key_paths(node: Any, prefix: str = "") -> set[str]:
    """Every key path of a JSON document: list items merged as ``[]``, named maps' keys as ``*``."""
    paths: set[str] = set()
    if isinstance(node, dict):
        named = prefix.rsplit(".", 1)[-1] in NAMED_MAPS
        for key, value in node.items():
            path = f"{prefix}.{'*' if named else key}" if prefix else key
            paths.add(path)
            paths |= key_paths(value, path)
    elif isinstance(node, list):
        for item in node:
            paths |= key_paths(item, f"{prefix}[]")
    return {path for path in paths if not any(path.startswith(skip) for skip in TIMING_DEPENDENT)}


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("demo")
    recipe = load_recipe_file(DEMO_RECIPE)
    # the keys, not the timings: a tenth of the demo's latency runs and short throughput windows (half its time)
    timing = {"iterations": 10, "throughput": recipe.benchmark.throughput.model_copy(
        update={"seconds": 0.3, "warmup_seconds": 0.1})}
    recipe = recipe.model_copy(update={"benchmark": recipe.benchmark.model_copy(update=timing)})
    result = run_recipe(recipe, RunOptions(out_dir=out, show_progress=False))
    return json.loads((Path(result.out_dir) / "report.json").read_text())


def test_named_maps_collapse_and_lists_merge() -> None:
    document = {"rows": [{"a": 1}, {"b": {"op_types": {"Conv": 2}}}], "c": None}
    assert key_paths(document) == {"rows", "rows[].a", "rows[].b", "rows[].b.op_types", "rows[].b.op_types.*", "c"}


def test_demo_report_has_the_fixtures_keys(report: dict[str, Any]) -> None:
    fixture = demo_report()
    if report["environment"]["available_targets"] != fixture["environment"]["available_targets"]:
        pytest.skip("this machine has other targets than the one that wrote the fixture: other rows")
    now, then = key_paths(report), key_paths(fixture)
    assert sorted(then - now - REMOVED_SINCE_FIXTURE) == [], "keys the report lost (document them above)"
    assert sorted(now - then - ADDED_SINCE_FIXTURE) == [], "keys the report gained (document them above)"


def test_demo_report_reads_back_as_written_and_fits_the_generated_schema(report: dict[str, Any]) -> None:
    """Issue 41: one typed model (``qdeploy.core.report.Report``) reads report.json back to the same JSON, and the
    schema generated from it (``qdeploy schema --report``) holds a current report, layers section included."""
    assert Report.model_validate_json(json.dumps(report)).to_json() == report
    jsonschema.validate(report, report_schema())


def test_demo_artifacts_keep_their_cache_keys(report: dict[str, Any]) -> None:
    """Cache keys hash each stage's config as dumped from its model: a step whose config dumps as it did gets the
    key it had, or every cache is silently rebuilt.  (Quantize's dump changed with its per-mode models; simplify's
    gained check_noise_factor, when its BatchNormalization fold began to round as ONNX Runtime does, so every step
    after the export is rebuilt once.)"""
    fixture = {row["name"]: row["lineage"] for row in demo_report()["artifacts"]}
    compared = 0
    for row in report["artifacts"]:
        # per_runtime auto: int8@ort and int8@openvino are the fixture's int8, one build per runtime
        for step, then in zip(row["lineage"], fixture[row["name"].split("@")[0]], strict=True):
            if step["config"] != then["config"]:
                break  # this step's settings changed, and so does every key after it
            assert step["key"] == then["key"], f"{row['name']}: {step['stage']}"
            compared += 1
    assert compared >= 3  # the export of each artifact
    assert report["model"]["exported_key"] == demo_report()["model"]["exported_key"]
