"""Variants that resolve to the same file are measured once and said to be the same file (issue 29)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from qdeploy.pipeline.recipe.loader import load_recipe_file
from qdeploy.pipeline.run.runner import RunOptions, run_recipe
from tests.helpers.models import write_recipe


def test_a_variant_with_another_variants_file_is_measured_once(tmp_path: Path, tiny_model_path: Path) -> None:
    # simplifying a simplified model again writes the same bytes: 'twin' is fp32's file under another name
    recipe = write_recipe(tmp_path, """
        name: t
        model: {onnx: tiny.onnx}
        variants:
          fp32: [simplify]
          twin: [simplify, simplify]
        targets: [ort:cpu]
        validate: {reference: fp32, samples: 2}
        benchmark: {iterations: 3, warmup: 0, rounds: 1}
        gates:
          - {variant: twin, target: "ort:cpu", metric: cosine, min: 0.99}
          - {variant: twin, target: "ort:cpu", metric: latency_ms, max: 10000}
        """)
    out = tmp_path / "out"
    result = run_recipe(load_recipe_file(recipe), RunOptions(out_dir=out, show_progress=False))
    report = json.loads((out / "report.json").read_text())
    rows = {row["name"]: row for row in report["artifacts"]}
    assert rows["twin"]["sha256"] == rows["fp32"]["sha256"]
    assert rows["twin"]["same_file_as"] == "fp32" and "same_file_as" not in rows["fp32"]
    sidecar = Path(rows["twin"]["sidecar"])
    assert json.loads(sidecar.read_text())["same_file_as"] == "fp32"
    listed = dict(line.split("  ")[::-1] for line in (out / "artifacts" / "SHA256SUMS").read_text().splitlines())
    assert listed.get(sidecar.name, hashlib.sha256(sidecar.read_bytes()).hexdigest()) == \
        hashlib.sha256(sidecar.read_bytes()).hexdigest()  # the rewritten sidecar's hash, where sidecars are listed

    timed = {row["variant"]: row for row in report["benchmarks"] if row["status"] == "ok"}
    assert timed["twin"]["latency_ms"] == timed["fp32"]["latency_ms"]  # one measurement, not two
    assert any("same file as fp32" in note for note in timed["twin"]["notes"])
    checked = {row["variant"]: row for row in report["validation"]}
    assert checked["twin"]["status"] == "passed" and checked["twin"]["metrics"] == checked["fp32"]["metrics"]
    assert any("same file as fp32" in warning for warning in checked["twin"]["warnings"])
    assert [gate["passed"] for gate in report["gates"]] == [True, True]  # gates naming the twin still evaluate
    assert result.exit_code == 0
