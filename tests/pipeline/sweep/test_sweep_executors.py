"""Sweeps on real executors: worker processes of this machine, and Ray started locally in the test.

Both run the same small recipes: same artifacts and validation statuses either way, failures isolated, and a
timeline in which no benchmark overlaps any other work on its node.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import onnx
import pytest
from typer.testing import CliRunner

from qdeploy.pipeline.sweep import load_sweep
from qdeploy.pipeline.sweep.executors import SweepOptions, SweepResult, run_sweep
from tests.helpers.models import tiny_cnn, write_recipe

pytestmark = pytest.mark.slow

RECIPE = """
    name: NAME
    model: {onnx: NAME.onnx}
    data:
      calib: {reader: random, samples: 4, seed: 1}
    variants:
      fp32: [simplify]
      VARIANT
    targets: [ort:cpu, ort:cuda]
    validate: {reference: fp32, samples: 2}
    benchmark: {batch_sizes: [1], warmup: 1, iterations: 4, rounds: 2}
    gates:
      - {variant: fp32, target: "ort:cpu", metric: size_bytes, max: MAX}
    """
# passed: an int8 variant; failed: a gate on the size that cannot hold; invalid: a model that does not exist
RECIPES = {"quant": ("int8: [simplify, {quantize: {calibration: {data: calib}}}]", "1e9"),
           "gated": ("fp16: [simplify, {fp16: {keep_io_types: true}}]", "10")}
EXPECTED = {"quant": "passed", "gated": "failed", "missing": "invalid", "twin-q-cpu": "passed"}
# the matrix recipe builds what "quant" builds: the two may write the same cache entries at the same time
SWEEP = """
    sweep: small
    recipes: [quant.yaml, gated.yaml, missing.yaml]
    matrix:
      models: [{name: twin, model: {onnx: quant.onnx}}]
      variant_sets:
        q: {fp32: [simplify], int8: [simplify, {quantize: {calibration: {data: calib}}}]}
      targets: {cpu: [ort:cpu]}
      recipe:
        data: {calib: {reader: random, samples: 4, seed: 1}}
        validate: {reference: fp32, samples: 2}
        benchmark: {batch_sizes: [1], warmup: 1, iterations: 4, rounds: 2}
    """


@pytest.fixture(scope="module")
def recipes(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """The sweep file (its recipe list and its matrix) as the command line would take it."""
    folder = tmp_path_factory.mktemp("recipes")
    for seed, (name, (variant, limit)) in enumerate(RECIPES.items()):
        onnx.save(tiny_cnn(seed=seed), folder / f"{name}.onnx")
        write_recipe(folder, RECIPE.replace("NAME", name).replace("VARIANT", variant).replace("MAX", limit),
                     f"{name}.yaml")
    write_recipe(folder, "name: missing\nmodel: {onnx: nowhere.onnx}\nvariants: {a: []}\n", "missing.yaml")
    return [write_recipe(folder, SWEEP, "sweep.yaml")]


@pytest.fixture(scope="module")
def local_sweep(recipes: list[Path], tmp_path_factory: pytest.TempPathFactory) -> SweepResult:
    out = tmp_path_factory.mktemp("local")
    options = SweepOptions(out_dir=out, executor="local", workers=2, lock_path=out.parent / "work.lock")
    return run_sweep(load_sweep(recipes), options)


def _benchmark_overlaps(timeline: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """(benchmark, other) pairs of items that ran at the same time on the same node."""
    clashes = []
    for bench in (record for record in timeline if record["kind"] == "benchmark"):
        for other in timeline:
            if other is not bench and other["node"] == bench["node"] and \
                    other["start"] < bench["end"] and bench["start"] < other["end"]:
                clashes.append((f"benchmark {bench['recipe']}", f"{other['kind']} {other['recipe']}"))
    return clashes


def _outcome(result: SweepResult) -> dict[str, Any]:
    """What must not depend on the executor: statuses, artifact hashes, validation statuses."""
    outcome: dict[str, Any] = {}
    for row in result.report["recipes"]:
        outcome[row["name"]] = {"status": row["status"]}
        if row["reports"].get("json"):
            report = json.loads((result.out_dir / row["reports"]["json"]).read_text())
            outcome[row["name"]]["artifacts"] = {a["name"]: a["sha256"] for a in report["artifacts"]}
            outcome[row["name"]]["validation"] = [(r["variant"], r["target"], r["status"])
                                                  for r in report["validation"]]
    return outcome


def test_local_sweep_isolates_failures_and_benchmarks_run_alone(local_sweep: SweepResult) -> None:
    report = local_sweep.report
    assert {row["name"]: row["status"] for row in report["recipes"]} == EXPECTED
    assert local_sweep.exit_code == 2 and report["exit_code"] == 2
    outcome = _outcome(local_sweep)
    assert set(outcome["quant"]["artifacts"]) == {"fp32", "int8"}
    assert ("int8", "ort:cpu", "passed") in outcome["quant"]["validation"]
    assert ("int8", "ort:cuda", "unavailable") in outcome["quant"]["validation"]
    assert any(f["recipe"] == "gated" and f["stage"] == "gate" for f in report["failures"])
    assert any(f["recipe"] == "missing" and "nowhere.onnx" in f["reason"] for f in report["failures"])
    assert outcome["twin-q-cpu"]["artifacts"] == outcome["quant"]["artifacts"]
    cache = local_sweep.out_dir / "cache"
    assert not list(cache.glob("*/.tmp-*"))  # no staging folder left by two workers writing one entry
    kinds = [(record["recipe"], record["kind"]) for record in report["timeline"]]
    for name in [*RECIPES, "twin-q-cpu"]:
        assert [kind for recipe, kind in kinds if recipe == name] == ["build", "validate", "benchmark", "report"]
    assert _benchmark_overlaps(report["timeline"]) == []
    for name in ("sweep.json", "sweep.md", "sweep.html"):
        assert (local_sweep.out_dir / name).is_file()


@pytest.mark.usefixtures("keep_logging")
def test_cli_rerun_of_a_sweep_recomputes_no_artifact(local_sweep: SweepResult, recipes: list[Path]) -> None:
    out = local_sweep.out_dir
    result = CliRunner().invoke(app_with_sweep(), ["sweep", *map(str, recipes), "--out", str(out), "-j", "2", "-q"])
    assert result.exit_code == 2, result.output
    for name in RECIPES:
        report = json.loads((out / name / "report.json").read_text())
        assert all(step["cached"] for artifact in report["artifacts"] for step in artifact["lineage"])
    assert _outcome(SweepResult(json.loads((out / "sweep.json").read_text()), out, 2)) == _outcome(local_sweep)


def app_with_sweep() -> Any:
    from qdeploy.cli import app

    return app


def test_ray_sweep_gives_the_same_results(local_sweep: SweepResult, recipes: list[Path],
                                          tmp_path: Path) -> None:
    pytest.importorskip("ray", reason="the Ray executor needs ray (pip install 'qdeploy[ray]')")
    result = run_sweep(load_sweep(recipes), SweepOptions(out_dir=tmp_path / "ray", executor="ray", ray_num_cpus=2))
    assert result.report["executor"]["kind"] == "ray" and result.exit_code == 2
    assert _outcome(result) == _outcome(local_sweep)
    timeline = result.report["timeline"]
    assert sum(record["kind"] == "benchmark" for record in timeline) == len(RECIPES) + 1
    assert _benchmark_overlaps(timeline) == []
    quant = json.loads((tmp_path / "ray" / "quant" / "report.json").read_text())
    assert not any(a["cached"] for a in quant["artifacts"])  # computed on Ray, not found in the local run's cache
