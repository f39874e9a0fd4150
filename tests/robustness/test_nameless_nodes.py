"""A model whose nodes have no names runs through every transform variant (issue 33: its int4 weight-only
artifact did not load in ONNX Runtime, "two nodes with same node name (_Q)")."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import onnx
import onnxruntime as ort

from tests.helpers.node_names import nameless_model
from tests.robustness.helpers import assert_published_consistent, qdeploy, recipe_with_model

RECIPE = """
name: nameless
model: {onnx: MODEL}
data:
  calib: {reader: random, samples: 4}
variants:
  fp32: [simplify]
  fp16: [simplify, fp16]
  int8: [simplify, {quantize: {calibration: {data: calib}}}]
  dynamic: [{quantize: {mode: dynamic}}]
  int4-wo: [simplify, {quantize: {mode: weight_only, bits: 4, group_size: 32}}]
  int8-wo: [{quantize: {mode: weight_only, bits: 8, group_size: 32}}]
targets: [ort:cpu]
validate: {reference: fp32, samples: 2}
benchmark: {enabled: false}
"""


def test_a_model_without_node_names_runs_every_variant(tmp_path: Path) -> None:
    recipe = recipe_with_model(tmp_path, nameless_model([""] * 5), body=RECIPE)
    code, stderr = qdeploy("run", str(recipe), "-q", "--out", str(tmp_path / "o"))
    report = assert_published_consistent(tmp_path / "o")
    assert report is not None, stderr
    assert report["failures"] == [], report["failures"]
    assert {row["name"] for row in report["artifacts"]} >= {"fp32", "fp16", "int8", "dynamic", "int4-wo", "int8-wo"}
    for row in report["artifacts"]:
        path = tmp_path / "o" / "artifacts" / f"{row['name']}.onnx"
        names = [node.name for node in onnx.load(str(path), load_external_data=False).graph.node]
        assert "" not in names and max(Counter(names).values()) == 1, (row["name"], names)
        ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        export = row["lineage"][0]
        assert export["stage"] == "export" and export["findings"]["node_names"]["unnamed_named"] == 5
    assert code in (0, 1), stderr  # 1: a gate may fail on random data; never a stage error
