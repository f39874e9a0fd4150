"""The whole recipe on models shaped like skl2onnx's (scikit-learn exported): ai.onnx.ml ops, ZipMap probabilities
as a sequence of maps, a tree ensemble whose file lists the default domain twice.

Before: validation failed every variant ("cannot compare non-numeric (object) values"), fp16 failed on the
untyped map and then on ONNX Runtime's dict outputs, simplify crashed inside onnx-ir ("SerdeError ...
_deserialize_graph") on an MLP classifier, and int8 failed with ONNX Runtime's "Failed to find proper ai.onnx
domain".  OpenVINO cannot read these models at all (its frontend has no ai.onnx.ml ops): its rows are
``unreadable``, which the run does not count against any variant."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from qdeploy.pipeline.recipe.loader import load_recipe_file
from qdeploy.pipeline.run.runner import RunOptions, run_recipe
from tests.helpers.logs import said_by
from tests.helpers.models import write_recipe

FEATURES = 6
RECIPE = """
    name: onnx-ml
    model:
      onnx: model.onnx
    data:
      val: {reader: npy, path: val}
    variants:
      fp32: [simplify]
      fp16: [simplify, fp16]
      int8: [simplify, {quantize: {mode: ptq, calibration: {data: val}, per_runtime: false}}]
    targets: [ort:cpu, openvino:cpu]
    validate: {data: val, samples: 4}
    benchmark: {batch_sizes: [1], warmup: 1, iterations: 2, rounds: 1}
    report: {formats: [json], layers: "off"}
    """


def _mlp_classifier() -> onnx.ModelProto:
    """x [N, 6] -> MatMul + Add -> Relu -> MatMul + Add (logits of 3 classes) -> Reshape -> Softmax -> ZipMap: what
    skl2onnx writes for an MLPClassifier: a label tensor and one {class: probability} map per row (the Reshape
    gives simplify's rewrites something to look at, through onnx-ir, which cannot hold the map)."""
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Add", ["h", "b1"], ["hb"]),
             helper.make_node("Relu", ["hb"], ["r"]), helper.make_node("MatMul", ["r", "w2"], ["z"]),
             helper.make_node("Add", ["z", "b2"], ["logits"]),
             helper.make_node("Reshape", ["logits", "rows"], ["rowed"]),
             helper.make_node("Softmax", ["rowed"], ["probabilities"], axis=1),
             helper.make_node("ArgMax", ["probabilities"], ["label"], axis=1, keepdims=0),
             helper.make_node("ZipMap", ["probabilities"], ["output_probability"], domain="ai.onnx.ml",
                              classlabels_int64s=[0, 1, 2])]
    inits = [numpy_helper.from_array(rng.standard_normal((FEATURES, 16)).astype(np.float32), "w1"),
             numpy_helper.from_array(rng.standard_normal(16).astype(np.float32), "b1"),
             numpy_helper.from_array(rng.standard_normal((16, 3)).astype(np.float32), "w2"),
             numpy_helper.from_array(rng.standard_normal(3).astype(np.float32), "b2"),
             numpy_helper.from_array(np.array([-1, 3], np.int64), "rows")]
    probability = helper.make_sequence_type_proto(helper.make_map_type_proto(
        TensorProto.INT64, helper.make_tensor_type_proto(TensorProto.FLOAT, None)))
    graph = helper.make_graph(nodes, "ONNX(Pipeline)", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                                       [None, FEATURES])],
                              [helper.make_tensor_value_info("label", TensorProto.INT64, [None]),
                               helper.make_value_info("output_probability", probability)], inits)
    return _model(graph, [("", 17), ("ai.onnx.ml", 1)])


def _tree_regressor() -> onnx.ModelProto:
    """x [N, 6] -> TreeEnsembleRegressor (two stumps) -> y [N, 1], its file importing ('', 17) twice as skl2onnx
    wrote a GradientBoostingRegressor's."""
    node = helper.make_node(
        "TreeEnsembleRegressor", ["x"], ["variable"], domain="ai.onnx.ml", n_targets=1,
        nodes_treeids=[0, 0, 0, 1, 1, 1], nodes_nodeids=[0, 1, 2, 0, 1, 2],
        nodes_featureids=[0, 0, 0, 3, 0, 0], nodes_values=[0.1, 0.0, 0.0, -0.4, 0.0, 0.0],
        nodes_modes=["BRANCH_LEQ", "LEAF", "LEAF", "BRANCH_LEQ", "LEAF", "LEAF"],
        nodes_truenodeids=[1, 0, 0, 1, 0, 0], nodes_falsenodeids=[2, 0, 0, 2, 0, 0],
        target_treeids=[0, 0, 1, 1], target_nodeids=[1, 2, 1, 2], target_ids=[0, 0, 0, 0],
        target_weights=[-1.5, 2.0, 0.25, -0.75], base_values=[0.5])
    graph = helper.make_graph([node], "ONNX(GradientBoostingRegressor)",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, FEATURES])],
                              [helper.make_tensor_value_info("variable", TensorProto.FLOAT, [None, 1])])
    return _model(graph, [("ai.onnx.ml", 1), ("", 17), ("", 17)])


def _model(graph: onnx.GraphProto, imports: list[tuple[str, int]]) -> onnx.ModelProto:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid(domain, version)
                                                    for domain, version in imports])
    model.ir_version = 8
    return model


def _run(tmp_path: Path, model: onnx.ModelProto) -> dict:
    onnx.save(model, tmp_path / "model.onnx")
    (tmp_path / "val").mkdir()
    for index in range(4):
        sample = np.random.default_rng(index).standard_normal((2, FEATURES)).astype(np.float32)
        np.save(tmp_path / "val" / f"s{index}.npy", sample)
    recipe = write_recipe(tmp_path, RECIPE)
    result = run_recipe(load_recipe_file(recipe), RunOptions(out_dir=tmp_path / "out", show_progress=False))
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert result.report["passed"] is True and report["failures"] == [], report["failures"]
    return report


def _ort_rows(report: dict) -> dict[str, dict]:
    return {row["variant"]: row for row in report["validation"] if row["target"] == "ort:cpu"}


def test_an_mlp_classifier_with_zipmap_probabilities_runs_the_whole_recipe(tmp_path: Path) -> None:
    report = _run(tmp_path, _mlp_classifier())
    rows = _ort_rows(report)
    assert {"fp32", "fp16", "int8"} <= set(rows)
    for variant in ("fp32", "fp16", "int8"):
        row = rows[variant]
        assert row["status"] == "passed", (variant, row.get("reason"))
        outputs = {out["name"]: out for out in row["outputs"]}
        assert outputs["output_probability"]["cosine"] > 0.98  # the maps compared as numbers, class by class
        assert outputs["label"]["within_tol"] is not None
    assert "openvino:cpu" in report["unreadable_targets"]


def test_a_tree_ensemble_importing_the_default_domain_twice_is_built_and_quantized(tmp_path: Path) -> None:
    report = _run(tmp_path, _tree_regressor())
    rows = _ort_rows(report)
    assert all(rows[variant]["status"] == "passed" for variant in ("fp32", "fp16", "int8")), rows
    for artifact in report["artifacts"]:
        imports = [entry.domain for entry in onnx.load(artifact["path"]).opset_import]
        assert imports.count("") + imports.count("ai.onnx") == 1, (artifact["name"], imports)


def test_onnx_runtimes_own_iris_classifier_of_ml_ops_only_is_quantized_packaged_and_timed_bound(
        tmp_path: Path) -> None:
    """ONNX Runtime's wheel ships logreg_iris.onnx (OnnxMLTools 1.2): LinearClassifier -> Normalizer -> ZipMap,
    importing ai.onnx.ml only.  Before: int8 failed ("'NoneType' object has no attribute 'graph'": ORT's symbolic
    shape inference returns nothing below opset 7), the package's own check failed on the ZipMap's dicts ("'list'
    object has no attribute 'shape'", so no package), and benchmarks timed the unbound call."""
    import onnxruntime

    model = onnx.load(Path(onnxruntime.__file__).parent / "datasets" / "logreg_iris.onnx")
    assert [entry.domain for entry in model.opset_import] == ["ai.onnx.ml"]
    onnx.save(model, tmp_path / "model.onnx")
    (tmp_path / "val").mkdir()
    for index in range(4):
        features = np.random.default_rng(index).uniform(0, 8, (3, 2)).astype(np.float32)
        np.save(tmp_path / "val" / f"s{index}.npy", features)
    recipe = write_recipe(tmp_path, RECIPE.replace("targets: [ort:cpu, openvino:cpu]", "targets: [ort:cpu]").replace(
        'layers: "off"}', 'layers: "off", packages: {which: passed}}'))  # every row packaged, whatever the verdict
    with said_by("qdeploy.stages.quantize.ptq._verify") as said:
        run_recipe(load_recipe_file(recipe), RunOptions(out_dir=tmp_path / "out", show_progress=False))
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["failures"] == [], report["failures"]
    rows = _ort_rows(report)
    assert all(rows[variant]["status"] == "passed" for variant in ("fp32", "fp16", "int8")), rows
    packages = report["packages"]
    assert packages["failed"] == [] and len(packages["written"]) == 3 and all(p["checked"] for p in packages["written"])
    assert any("int8: the model has no node int8 computes" in message for message in said.messages)  # not only
    # a row of fp32 kernels
    assert {row["timed_call"] for row in report["benchmarks"]} == {
        "InferenceSession.run_with_iobinding() on inputs bound once, outputs to host memory"}
