"""A dynamic batch axis is exercised, not assumed: every artifact is validated and benchmarked at each size.

An input overridden to [batch, 3, 16, 16] once left the exported model's output declared [1, 10]; the fp32
and fp16 artifacts then failed at batch 8 on ONNX Runtime while int8 (re-inferred by quantization) passed.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

import qdeploy.stages.validate as validate
from qdeploy.calibration.batches import BatchError, batch_axes, make_batch
from qdeploy.core.context import Artifact
from qdeploy.pipeline.recipe.loader import load_recipe_file
from qdeploy.pipeline.run.runner import RunOptions, run_recipe
from qdeploy.stages.export import apply_input_overrides
from qdeploy.stages.export.config import InputSpec
from tests.helpers.models import tiny_cnn, write_recipe


def _dims(value: onnx.ValueInfoProto) -> list[int | str]:
    return [dim.dim_param or dim.dim_value for dim in value.type.tensor_type.shape.dim]


def test_an_input_override_re_infers_the_output_shapes() -> None:
    model = tiny_cnn()
    changed = apply_input_overrides(model, [InputSpec(name="input", shape=["batch", 3, 16, 16])])
    assert _dims(model.graph.output[0]) == ["batch", 10]
    assert changed == {"logits": {"declared": [1, 10], "now": ["batch", 10]}}
    assert not model.graph.value_info  # stale intermediate shapes are gone too
    unchanged = tiny_cnn()
    assert apply_input_overrides(unchanged, [InputSpec(name="input")]) == {}  # a dtype-only spec changes no shape
    assert _dims(unchanged.graph.output[0]) == [1, 10]


def test_an_output_inference_cannot_reach_keeps_its_rank_and_loses_its_stale_sizes() -> None:
    from onnx import TensorProto, helper

    graph = helper.make_graph(  # onnx's shape inference knows no com.microsoft op: the output stays unknown
        [helper.make_node("Gelu", ["x"], ["y"], domain="com.microsoft")], "contrib",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, "width"])])
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    model = helper.make_model(graph, opset_imports=opsets)
    changed = apply_input_overrides(model, [InputSpec(name="x", shape=["batch", 4])])
    assert changed == {"y": {"declared": [1, "width"], "now": [None, "width"]}}
    onnx.checker.check_model(model)  # a graph output that had a shape keeps one


@pytest.mark.slow
def test_symbolic_batch_through_fp32_fp16_int8_on_both_runtimes(tmp_path: Path) -> None:
    onnx.save(tiny_cnn(), tmp_path / "tiny.onnx")
    recipe = write_recipe(tmp_path, """
        name: batches
        model:
          onnx: tiny.onnx
          inputs: [{name: input, shape: [batch, 3, 16, 16]}]
        data:
          calib: {reader: random, samples: 8, seed: 1}
        variants:
          fp32: [simplify]
          fp16: [simplify, fp16]
          int8: [simplify, {quantize: {mode: ptq, calibration: {data: calib}, per_runtime: false}}]
        targets: [ort:cpu, openvino:cpu]
        validate: {reference: fp32, samples: 2}
        benchmark: {batch_sizes: [1, 8], warmup: 1, iterations: 3, rounds: 1, device_default: false}
        """)
    report = run_recipe(load_recipe_file(recipe), RunOptions(out_dir=tmp_path / "out", show_progress=False)).report
    rows = {(row["variant"], row["target"], row["batch_size"]): row for row in report["benchmarks"]}
    assert len(rows) == 3 * 2 * 2
    for key, row in rows.items():
        assert row["status"] == "ok", (key, row["reason"])
        assert row["data"]["shapes"]["input"][0] == key[2]
    for row in report["validation"]:
        if row["target"] != "reference:cpu":
            assert row["status"] == "passed", row["reason"]
            assert row["batch_sizes_validated"] == [8] and row["samples"] == 2
            assert row["unattainable"] == []  # the noise floor compares the same feeds, batched ones included
    for name in ("fp32", "fp16", "int8"):
        model = onnx.load(str(tmp_path / "out" / "artifacts" / f"{name}.onnx"))
        assert _dims(model.graph.output[0]) == ["batch", 10], name


def test_validation_names_a_batch_the_artifact_cannot_take(tmp_path: Path) -> None:
    from onnx import numpy_helper

    reference = tiny_cnn()
    apply_input_overrides(reference, [InputSpec(name="input", shape=["batch", 3, 16, 16])])
    baked = onnx.ModelProto()
    baked.CopyFrom(reference)  # a fold of Shape at batch 1: Flatten becomes Reshape to the constant [1, 8]
    flatten = next(node for node in baked.graph.node if node.op_type == "Flatten")
    flatten.op_type, flatten.input[:] = "Reshape", [flatten.input[0], "baked_shape"]
    baked.graph.initializer.append(numpy_helper.from_array(np.array([1, 8], np.int64), "baked_shape"))
    artifacts = {}
    for name, model in (("ref", reference), ("baked", baked)):
        onnx.save(model, tmp_path / f"{name}.onnx")
        artifacts[name] = Artifact(path=tmp_path / f"{name}.onnx", sidecar=tmp_path / f"{name}.json", key=name,
                                   sha256="", size_bytes=0, stages=("simplify",), parent=None)
    onnx.save(reference, tmp_path / "model.onnx")
    recipe = load_recipe_file(write_recipe(tmp_path, """
        name: t
        model: {onnx: model.onnx}
        variants: {ref: [], baked: []}
        validate: {reference: ref, samples: 2, localize: false}
        benchmark: {batch_sizes: [1, 8]}
        """))
    ctx = recipe.stage_context("*", tmp_path / "work")
    rows = {row.variant: row for row in validate.run(artifacts, ["ort:cpu", "openvino:cpu"], recipe.validate_, ctx)
            if row.target == "ort:cpu"}
    assert rows["ref"].status == "passed" and rows["ref"].batch_sizes_validated == [8]
    assert rows["baked"].status == "error"  # batch 1 alone would pass: the samples are of batch 1
    assert rows["baked"].reason.startswith("BatchRunError: at batch 8 (the 2 samples at their own size ran): ")
    assert "Reshape" in rows["baked"].reason


def test_a_batch_the_reference_cannot_take_is_not_validated_and_rows_say_so(tmp_path: Path) -> None:
    onnx.save(tiny_cnn(), tmp_path / "model.onnx")  # input [1, 3, 16, 16]: batch 1 only
    artifact = Artifact(path=tmp_path / "model.onnx", sidecar=tmp_path / "m.json", key="m", sha256="",
                        size_bytes=0, stages=(), parent=None)
    recipe = load_recipe_file(write_recipe(tmp_path, """
        name: t
        model: {onnx: model.onnx}
        variants: {v: []}
        validate: {samples: 2}
        benchmark: {batch_sizes: [1, 4]}
        """))
    ctx = recipe.stage_context("*", tmp_path / "work")
    [row] = validate.run({"exported": artifact}, ["ort:cpu"], recipe.validate_, ctx)
    assert row.status == "passed" and row.batch_sizes_validated == []
    assert any(w.startswith("batch 4 not validated: batch 4 cannot be fed: no input has a dynamic batch")
               for w in row.warnings)


def _model_with_inputs(tmp_path: Path, inputs: dict[str, list[int | str]]) -> Path:
    from onnx import TensorProto, helper

    values = [helper.make_tensor_value_info(name, TensorProto.FLOAT, dims) for name, dims in inputs.items()]
    first = next(iter(inputs))
    graph = helper.make_graph([helper.make_node("Identity", [first], ["y"])], "g", values,
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    path = tmp_path / "m.onnx"
    onnx.save(helper.make_model(graph), path)
    return path


def test_batch_axes_follow_the_batch_symbol(tmp_path: Path) -> None:
    path = _model_with_inputs(tmp_path, {"x": ["N", 16], "state": [2, "N", 8], "sr": [], "fixed": [1, 4]})
    axes = batch_axes(path)
    assert axes.axes == {"x": 0, "state": 1, "sr": None, "fixed": None}
    samples = [{"x": np.full((1, 16), i, np.float32), "state": np.full((2, 1, 8), i, np.float32),
                "sr": np.array(16000.0, np.float32), "fixed": np.zeros((1, 4), np.float32)} for i in range(3)]
    batch = make_batch(samples, axes, 5)
    assert batch.feed["x"].shape == (5, 16) and batch.feed["state"].shape == (2, 5, 8)
    assert batch.feed["sr"].shape == () and batch.feed["fixed"].shape == (1, 4)
    assert batch.feed["x"][:, 0].tolist() == [0, 1, 2, 0, 1]  # rows in order, cycled: only values the data holds
    assert batch.feed["state"][0, :, 0].tolist() == [0, 1, 2, 0, 1]
    assert batch.info["distinct_rows"] == 3 and batch.info["repeated"] is True


def test_samples_of_another_size_are_not_stacked(tmp_path: Path) -> None:
    path = _model_with_inputs(tmp_path, {"x": ["batch", 3, "width"]})
    samples = [{"x": np.ones((1, 3, 8), np.float32)}, {"x": np.ones((1, 3, 12), np.float32)},
               {"x": np.zeros((2, 3, 8), np.float32)}]
    batch = make_batch(samples, batch_axes(path), 3)
    assert batch.feed["x"].shape == (3, 3, 8) and batch.feed["x"][:, 0, 0].tolist() == [1, 0, 0]
    assert batch.info["samples_skipped"].startswith("1 samples of other shapes")
    with pytest.raises(BatchError, match="no input has a dynamic batch dimension"):
        make_batch(samples[:1], batch_axes(_model_with_inputs(tmp_path, {"x": [1, 3, 8]})), 2)


def test_a_model_exported_at_a_fixed_batch_takes_that_batch_only(tmp_path: Path) -> None:
    axes = batch_axes(_model_with_inputs(tmp_path, {"x": [4, 4]}))
    sample = {"x": np.arange(16, dtype=np.float32).reshape(4, 4)}
    assert axes.fixed_batch() == 4
    assert np.array_equal(make_batch([sample], axes, 4).feed["x"], sample["x"])  # fed as the sample holds it
    with pytest.raises(BatchError, match="batch 8 cannot be fed"):
        make_batch([sample], axes, 8)


def test_inputs_that_lead_with_different_symbols_are_fed_whole(tmp_path: Path) -> None:
    """A graph network's nodes and edges are one molecule, not two batches: before, the most common leading symbol
    was taken for the batch and one row of it fed (caustic-nmr's benchmark timed one residue of four)."""
    path = _model_with_inputs(tmp_path, {"feat": ["num_nodes", 4], "pos": ["num_nodes", 3],
                                         "edge_feat": ["num_edges", 3], "edges": [2, "num_edges"]})
    axes = batch_axes(path)
    assert axes.axes == dict.fromkeys(["feat", "pos", "edge_feat", "edges"]) and axes.leading == ("num_nodes",
                                                                                                   "num_edges")
    sample = {"feat": np.ones((5, 4), np.float32), "pos": np.ones((5, 3), np.float32),
              "edge_feat": np.ones((7, 3), np.float32), "edges": np.zeros((2, 7), np.float32)}
    batch = make_batch([sample], axes, 1)
    assert {name: value.shape for name, value in batch.feed.items()} == {name: value.shape
                                                                         for name, value in sample.items()}
    with pytest.raises(BatchError, match=r"lead with different dimensions \(num_nodes, num_edges\)"):
        make_batch([sample], axes, 2)
