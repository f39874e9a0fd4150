"""Sweeps without worker processes: the sweep file, its expansion, `qdeploy check`, the lock, the scheduler."""

from __future__ import annotations

import fcntl
import json
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from typer.testing import CliRunner

from qdeploy.cli import app
from qdeploy.core.errors import RecipeError
from qdeploy.core.files import SHARED_TMPDIR_ENV
from qdeploy.pipeline.recipe.loader import load_recipe_file
from qdeploy.pipeline.run.runner import RunOptions, build_phase, plan_run, validate_phase
from qdeploy.pipeline.sweep import describe_sweep, is_sweep_file, load_sweep
from qdeploy.pipeline.sweep.executors import Job, Scheduler
from qdeploy.pipeline.sweep.executors_ray import benchmark_node, group_targets
from qdeploy.pipeline.sweep.report import build_sweep_report, write_sweep_reports
from qdeploy.pipeline.sweep.work import WorkItem, WorkReply, default_lock_path, execute, machine_lock, merge_rows
from tests.helpers.models import tiny_cnn, write_recipe

MATRIX = """
    sweep: release
    matrix:
      models:
        - {name: a, model: {onnx: models/a.onnx}}
        - {name: b, model: {onnx: models/b.onnx}, data: {calib: {reader: random, samples: 4, seed: 2}}}
      variant_sets:
        fp: {fp32: [simplify], fp16: [simplify, fp16]}
        q: {fp32: [simplify], int8: [simplify, {quantize: {calibration: {data: calib}, per_runtime: false}}]}
      targets: {cpu: [ort:cpu], both: [ort:cpu, openvino:cpu]}
      recipe:
        data: {calib: {reader: random, samples: 8, seed: 1}}
        validate: {reference: fp32, samples: 2}
        benchmark: {enabled: false}
        gates:
          - {variant: fp16, target: "ort:cpu", metric: cosine, min: 0.99}
          - {variant: int8, target: "openvino:cpu", metric: cosine, min: 0.9}
    """


def _models(folder: Path) -> None:
    (folder / "models").mkdir()
    onnx.save(tiny_cnn(seed=0), folder / "models" / "a.onnx")
    onnx.save(tiny_cnn(seed=1), folder / "models" / "b.onnx")


def test_matrix_expands_models_x_variant_sets_x_target_sets(tmp_path: Path) -> None:
    _models(tmp_path)
    plan = load_sweep([write_recipe(tmp_path, MATRIX, "sweep.yaml")])
    assert plan.name == "release" and not plan.invalid
    by_name = {entry.name: entry.recipe for entry in plan.entries}
    assert list(by_name) == [f"{m}-{v}-{t}" for m in "ab" for v in ("fp", "q") for t in ("cpu", "both")]
    recipe = by_name["b-q-both"]
    assert recipe is not None
    assert list(recipe.variants) == ["fp32", "int8"] and recipe.targets == ["ort:cpu", "openvino:cpu"]
    assert recipe.resolve(recipe.model.onnx or "") == (tmp_path / "models" / "b.onnx").resolve()
    assert recipe.data["calib"].seed == 2  # the model's own dataset wins over the shared one
    # a gate is kept only where its variant and target exist
    assert [(g.variant, g.target) for g in recipe.gates] == [("int8", "openvino:cpu")]
    assert [(g.variant, g.target) for g in by_name["a-fp-cpu"].gates] == [("fp16", "ort:cpu")]
    assert by_name["a-q-cpu"].gates == []
    text = describe_sweep(plan)
    assert "8 recipes, 8 valid, 0 invalid" in text and "int8 [simplify > quantize]" in text


def test_a_matrix_recipe_with_a_bad_path_is_invalid_the_others_stay(tmp_path: Path) -> None:
    _models(tmp_path)
    (tmp_path / "models" / "b.onnx").unlink()
    plan = load_sweep([write_recipe(tmp_path, MATRIX, "sweep.yaml")])
    invalid = {entry.name: entry.error for entry in plan.invalid}
    assert set(invalid) == {"b-fp-cpu", "b-fp-both", "b-q-cpu", "b-q-both"}
    assert "model.onnx" in invalid["b-q-cpu"] and "b.onnx" in invalid["b-q-cpu"]
    assert "INVALID" in describe_sweep(plan)


@pytest.mark.parametrize(("old", "new", "field", "words"), [
    ("variant_sets:", "variant_set:", "matrix.variant_set", "unknown field 'variant_set'"),
    ("variant_sets:", "'v[0]': 1\n      variant_sets:", "matrix.v[0]", "unknown field 'v[0]'"),  # was IndexError
    ("      recipe:", "      recipe:\n        name: x", "matrix.recipe", "may not set name"),
    ("fp: {fp32", "f p: {fp32", "matrix.variant_sets", "variant set name 'f p'"),
    # bounded: a matrix over its cap (8 recipes here), globs that would walk the file system
    ("sweep: release", "sweep: release\n    max_recipes: 7", None, "expands into 8 recipes, more than max_recipes (7)"),
    ("sweep: release", "sweep: release\n    recipes: ['/**/*.yaml']", "recipes", "under the sweep file's folder"),
    ("sweep: release", "sweep: release\n    recipes: ['../*.yaml']", "recipes", "name a file outside it"),
])
def test_sweep_file_errors_name_the_line_and_field(tmp_path: Path, old: str, new: str, field: str,
                                                   words: str) -> None:
    _models(tmp_path)
    path = write_recipe(tmp_path, MATRIX.replace(old, new), "sweep.yaml")
    with pytest.raises(RecipeError) as error:
        load_sweep([path])
    assert error.value.field == field and words in str(error.value)
    assert error.value.line is not None and str(path) in str(error.value)


def test_recipe_files_and_globs_invalid_ones_become_entries(tmp_path: Path, tiny_model_path: Path) -> None:
    write_recipe(tmp_path, "name: good\nmodel: {onnx: tiny.onnx}\nvariants: {fp32: [simplify]}\n", "good.yaml")
    write_recipe(tmp_path, "name: bad\nmodel: {onnx: tiny.onnx}\nvariants: {x: [nope]}\n", "bad.yaml")
    sweep = write_recipe(tmp_path, "sweep: s\nrecipes: ['*.yaml', good.yaml, 'none/*.yaml']\n", "sweep.yaml")
    assert is_sweep_file(sweep) and not is_sweep_file(tmp_path / "good.yaml")
    plan = load_sweep([sweep])
    assert [(e.name, e.valid) for e in plan.entries] == [("bad", False), ("good", True), ("x", False)]
    assert "unknown stage 'nope'" in (plan.entries[0].error or "")
    assert "matches no file" in (plan.entries[2].error or "")
    # two recipes with one name get their own folders
    (tmp_path / "twin").mkdir()
    twin = write_recipe(tmp_path / "twin", "name: good\nmodel: {onnx: ../tiny.onnx}\nvariants: {a: []}\n")
    names = [e.name for e in load_sweep([tmp_path / "good.yaml", twin]).entries]
    assert names == ["good", "good-2"]


@pytest.mark.usefixtures("keep_logging")
def test_check_prints_the_expanded_plan_of_a_sweep_and_still_checks_recipes(tmp_path: Path,
                                                                           tiny_recipe: Path) -> None:
    _models(tmp_path)
    runner = CliRunner()
    sweep = write_recipe(tmp_path, MATRIX, "sweep.yaml")
    result = runner.invoke(app, ["check", str(sweep)])
    assert result.exit_code == 0, result.output
    assert "sweep release: 8 recipes" in result.output and "b-q-both" in result.output
    result = runner.invoke(app, ["check", str(tiny_recipe)])
    assert result.exit_code == 0 and "recipe tiny: valid" in result.output
    (tmp_path / "models" / "a.onnx").unlink()
    result = runner.invoke(app, ["check", str(sweep)])
    assert result.exit_code == 2 and "4 invalid" in result.output


def test_machine_lock_keeps_a_benchmark_alone(tmp_path: Path) -> None:
    lock = tmp_path / "work.lock"

    def can(kind: int) -> bool:  # another open file description: flock conflicts as across processes
        with lock.open("a") as other:
            try:
                fcntl.flock(other, kind | fcntl.LOCK_NB)
            except BlockingIOError:
                return False
            fcntl.flock(other, fcntl.LOCK_UN)
            return True

    with machine_lock(lock, exclusive=False):
        assert can(fcntl.LOCK_SH) and not can(fcntl.LOCK_EX)
    with machine_lock(lock, exclusive=True):
        assert not can(fcntl.LOCK_SH)
    assert can(fcntl.LOCK_EX)


def test_the_machine_lock_stays_shared_under_a_private_tmpdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A supervised `qdeploy run` has a TMPDIR of its own; the lock all sweeps of the user share must not follow it."""
    monkeypatch.setenv("TMPDIR", str(tmp_path / "private"))
    monkeypatch.setenv(SHARED_TMPDIR_ENV, str(tmp_path))
    monkeypatch.setattr(tempfile, "tempdir", None)

    assert default_lock_path().parent == tmp_path


def test_targets_go_to_nodes_that_have_them() -> None:
    cpu = {"id": "cpu-node", "ip": "10.0.0.1", "cpus": 8, "gpus": 0, "needs": set()}
    gpu = {"id": "gpu-node", "ip": "10.0.0.2", "cpus": 8, "gpus": 1, "needs": {"GPU"}}
    targets = ["ort:cpu", "ort:cuda", "openvino:cpu", "openvino:gpu"]
    assert group_targets(targets, [cpu, gpu]) == [("ort:cpu", "openvino:cpu", "openvino:gpu"), ("ort:cuda",)]
    assert benchmark_node("GPU", [cpu, gpu], busy=set()) is gpu
    assert benchmark_node("GPU", [cpu, gpu], busy={"gpu-node"}) is None  # waits for the GPU node, never the CPU one
    assert benchmark_node(None, [cpu, gpu], busy={"cpu-node"}) is gpu
    # without a GPU anywhere, ort:cuda runs with the CPU targets and reports itself unavailable
    assert group_targets(targets, [cpu]) == [tuple(targets)]


def test_evaluation_split_by_target_merges_into_the_whole_phase_order(tmp_path: Path, tiny_model_path: Path) -> None:
    recipe = load_recipe_file(write_recipe(tmp_path, """
        name: split
        model: {onnx: tiny.onnx}
        variants: {fp32: [simplify], fp16: [simplify, fp16]}
        targets: [ort:cpu, openvino:cpu]
        validate: {reference: fp32, samples: 2}
        benchmark: {device_default: false}
        """))
    plan = plan_run(recipe, RunOptions(out_dir=tmp_path / "out"))
    outcome = build_phase(plan)
    whole = validate_phase(plan, outcome)
    parts = [validate_phase(plan, outcome, targets=["openvino:cpu"]),
             validate_phase(plan, outcome, targets=["ort:cpu"])]
    merged = merge_rows(parts, list(outcome.evaluated), plan.targets, [1])
    assert [(r.variant, r.target, r.status) for r in merged] == [(r.variant, r.target, r.status) for r in whole]
    assert len(whole) == 5  # 2 variants x 2 targets, and fp16's true-precision check on reference:cpu
    assert [r.target for r in merged].count("reference:cpu") == 1


class InlineExecutor:
    """Runs items in this process, one at a time; `lose` names (kind, recipe) whose worker 'dies' every time."""

    def __init__(self, lose: set[tuple[str, str]] = frozenset()) -> None:  # type: ignore[assignment]
        self.lose = lose
        self.queue: list[tuple[WorkItem, tuple[Any, ...]]] = []

    def describe(self) -> dict[str, Any]:
        return {"kind": "inline", "nodes": []}

    def target_groups(self, targets: list[str]) -> list[tuple[str, ...] | None]:
        return [None]

    def can_submit(self, item: WorkItem, running: list[WorkItem]) -> bool:
        return not running

    def submit(self, item: WorkItem, payload: tuple[Any, ...]) -> None:
        self.queue.append((item, payload))

    def wait(self) -> list[tuple[WorkItem, WorkReply | BaseException]]:
        item, payload = self.queue.pop(0)
        if (item.kind, item.recipe) in self.lose:
            return [(item, RuntimeError("worker killed"))]
        return [(item, execute(item, payload, None))]

    def close(self) -> None:
        pass


def test_scheduler_isolates_failures_and_sets_the_exit_status(tmp_path: Path, tiny_model_path: Path) -> None:
    body = """
        name: NAME
        model: {onnx: tiny.onnx}
        DATA
        variants: {fp32: [simplify], VARIANT}
        validate: {reference: fp32, samples: 2}
        benchmark: {iterations: 2, warmup: 0, rounds: 1}
        gates: [{variant: fp32, target: "ort:cpu", metric: size_bytes, max: MAX}]
        """
    # only the recipe that uses the bad dataset names it (benchmarks read a recipe's real data when it has some)
    paths = [write_recipe(tmp_path, body.replace("NAME", name).replace("VARIANT", variant).replace("MAX", limit)
                          .replace("DATA", "data: {bad: {reader: npy, path: bad}}" if name == "data" else ""),
                          f"{name}.yaml")
             for name, variant, limit in [("ok", "fp16: [simplify, fp16]", "1e9"), ("gate", "b: []", "10"),
                                          ("data", "int8: [{quantize: {calibration: {data: bad}}}]", "1e9"),
                                          ("crash", "b: []", "1e9")]]
    (tmp_path / "bad").mkdir()
    np.save(tmp_path / "bad" / "sample.npy", np.zeros((1, 3, 4, 4), np.float32))  # the model takes 16x16
    write_recipe(tmp_path, "name: broken\nmodel: {onnx: missing.onnx}\nvariants: {a: []}\n", "broken.yaml")
    plan = load_sweep([*paths, tmp_path / "broken.yaml"])
    out = tmp_path / "sweep"
    jobs = [Job(entry=entry, folder=out / entry.name) for entry in plan.entries]
    for job in jobs:
        if job.entry.recipe is not None:
            job.plan = plan_run(job.entry.recipe, RunOptions(out_dir=job.folder, cache_dir=out / "cache"))
        else:
            job.status, job.reason = "invalid", job.entry.error
    timeline = Scheduler(jobs, InlineExecutor(lose={("validate", "crash")})).run()
    status = {job.entry.name: job.status for job in jobs}
    # a variant's bad data makes its recipe invalid (exit 2) yet its other variants are reported
    assert status == {"ok": "passed", "gate": "failed", "data": "invalid", "crash": "error", "broken": "invalid"}
    assert "died twice" in (jobs[3].reason or "") and "shape [1, 3, 4, 4]" in (jobs[2].reason or "")
    assert jobs[2].result is not None and [a["name"] for a in jobs[2].result.report["artifacts"]] == ["fp32"]
    assert [r["kind"] for r in timeline if r["recipe"] == "ok"] == ["build", "validate", "benchmark", "report"]

    report = build_sweep_report("s", jobs, timeline, {"kind": "inline"}, out, started=timeline[0]["start"],
                                seconds=1.0)
    assert report.exit_code == 2 and report.counts["passed"] == 1
    write_sweep_reports(report, out)
    saved = json.loads((out / "sweep.json").read_text())
    assert {(r["recipe"], r["variant"], r["target"]) for r in saved["rows"] if r["recipe"] == "ok"} == \
        {("ok", "fp32", "ort:cpu"), ("ok", "fp16", "ort:cpu"), ("ok", "fp16", "reference:cpu")}
    assert (out / saved["recipes"][0]["reports"]["md"]).is_file()
    reasons = {(f["recipe"], f["stage"]) for f in saved["failures"]}
    assert {("gate", "gate"), ("data", "quantize"), ("crash", None), ("broken", None)} <= reasons
    assert "[ok](ok/report.md)" in (out / "sweep.md").read_text()
    link = saved["recipes"][0]["reports"].get("html") or "ok/report.md"
    assert f'href="{link}"' in (out / "sweep.html").read_text() and (out / link).is_file()


def test_a_sweep_times_a_pair_at_the_precision_its_validation_ships(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """As `qdeploy run` does: an fp16 artifact that misses at the bf16 default and holds pinned to f32 is
    benchmarked pinned, not at the default validation rejected."""
    from qdeploy.targets.int8_path import FLAGS_ENV
    from tests.helpers.precision import BF16_CPU, offset_model, openvino_runs_bf16_here

    if not openvino_runs_bf16_here():
        pytest.skip("this machine's OpenVINO cannot run bfloat16: the default would hold at f32 already")
    monkeypatch.setenv(FLAGS_ENV, BF16_CPU)
    onnx.save(offset_model(), tmp_path / "offset.onnx")
    recipe = write_recipe(tmp_path, """
        name: pinned
        model: {onnx: offset.onnx, inputs: [{name: x, shape: [2, 16]}]}
        variants: {fp32: [], fp16: [{fp16: {keep_io_types: true}}]}
        targets: [openvino:cpu]
        validate: {reference: fp32, samples: 2, tolerance: {cosine_min: 0.999}}
        benchmark: {iterations: 2, warmup: 0, rounds: 1}
        """, "pinned.yaml")
    plan = load_sweep([recipe])
    job = Job(entry=plan.entries[0], folder=tmp_path / "out" / "pinned")
    job.plan = plan_run(job.entry.recipe, RunOptions(out_dir=job.folder, cache_dir=tmp_path / "cache"))
    Scheduler([job], InlineExecutor()).run()
    assert job.result is not None, job.reason
    rows = {(row["variant"], row["target"]): row for row in job.result.report["benchmarks"]}
    validated = {(row["variant"], row["target"]): row for row in job.result.report["validation"]}
    assert validated[("fp16", "openvino:cpu")].get("deploy_precision") == "f32"
    assert rows[("fp16", "openvino:cpu")]["precision_hint"] == "f32"


def test_a_shared_gate_on_a_settings_row_goes_to_the_recipes_that_build_its_variant() -> None:
    """'int4@f32' belongs with the recipes that build int4 (and hold the target), not only with a variant named so."""
    from qdeploy.pipeline.sweep import _gate_of

    gate = {"variant": "int4@f32", "target": "openvino:cpu", "metric": "latency_ms", "max": 10}
    assert _gate_of(gate, {"int4", "exported"}, ["ort:cpu", "openvino:cpu"])
    assert not _gate_of(gate, {"int8", "exported"}, ["ort:cpu", "openvino:cpu"])
    assert not _gate_of(gate, {"int4", "exported"}, ["ort:cpu"])
