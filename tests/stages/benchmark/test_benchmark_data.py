"""Benchmarks fed the recipe's data: models that random arrays built from declared shapes break.

Each model here is one class of real-model failure (issue 15 section 2, issue 14): token-type ids into a
2-row embedding, a pooling window wider than a dynamic dimension set to 1, an output declared with the wrong
rank, an output listed twice, a batch the model or the memory cannot take, a run that would never end.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from pydantic import ValidationError

from qdeploy.core.context import Artifact, StageContext
from qdeploy.pipeline.recipe.loader import load_recipe_file
from qdeploy.stages import benchmark
from qdeploy.stages.benchmark import BenchmarkConfig
from qdeploy.stages.benchmark import _data as benchmark_data
from qdeploy.stages.benchmark._runtime import TIMED_CALLS
from qdeploy.stages.benchmark.config import DEFAULT_MAX_SECONDS
from tests.helpers.models import tiny_cnn, write_recipe

TARGETS = ["ort:cpu", "openvino:cpu"]
QUICK = {"warmup": 1, "iterations": 3, "rounds": 1, "busy_seconds": 0}


def _artifact(path: Path) -> Artifact:
    return Artifact(path=path, sidecar=path.with_suffix(".json"), key=path.stem, sha256="", size_bytes=0,
                    stages=(), parent=None)


def _save(model: onnx.ModelProto, path: Path) -> Path:
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, path)
    return path


def _ctx(folder: Path, data: str = "", validate: str = "") -> StageContext:
    """A stage context on a recipe in `folder` (model.onnx) with the given data and validate sections."""
    body = f"""
        name: t
        model: {{onnx: model.onnx}}
        {data}
        variants: {{v: []}}
        {validate}
        """
    recipe = load_recipe_file(write_recipe(folder, body))
    return recipe.stage_context("*", folder / "work")


def token_type_model() -> onnx.ModelProto:
    """input_ids [batch, seq] (vocab 200) and token_type_ids [batch, seq] (2 types) -> mean embedding [batch, 8]."""
    rng = np.random.default_rng(0)
    graph = helper.make_graph(
        [helper.make_node("Gather", ["word_embedding", "input_ids"], ["words"]),
         helper.make_node("Gather", ["token_type_embedding", "token_type_ids"], ["types"], name="type_gather"),
         helper.make_node("Add", ["words", "types"], ["summed"]),
         helper.make_node("ReduceMean", ["summed"], ["pooled"], axes=[1], keepdims=0)],
        "token_types",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq"]),
         helper.make_tensor_value_info("token_type_ids", TensorProto.INT64, ["batch", "seq"])],
        [helper.make_tensor_value_info("pooled", TensorProto.FLOAT, ["batch", 8])],
        [numpy_helper.from_array(rng.standard_normal((200, 8)).astype(np.float32), "word_embedding"),
         numpy_helper.from_array(rng.standard_normal((2, 8)).astype(np.float32), "token_type_embedding")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def pooling_model() -> onnx.ModelProto:
    """x [batch, 3, height, width] -> AveragePool 4x4 -> GlobalAveragePool -> Flatten: needs sides of 4 or more."""
    graph = helper.make_graph(
        [helper.make_node("AveragePool", ["x"], ["pooled"], kernel_shape=[4, 4], strides=[2, 2]),
         helper.make_node("GlobalAveragePool", ["pooled"], ["global"]),
         helper.make_node("Flatten", ["global"], ["y"])],
        "pooling",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3, "height", "width"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _write_npz(folder: Path, samples: list[dict[str, np.ndarray]]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for index, sample in enumerate(samples):
        np.savez(folder / f"{index:03d}.npz", **sample)


def test_token_type_ids_come_from_the_data_not_from_0_to_99(tmp_path: Path) -> None:
    path = _save(token_type_model(), tmp_path / "model.onnx")
    rng = np.random.default_rng(1)
    _write_npz(tmp_path / "val", [{"input_ids": rng.integers(0, 200, (1, 6)),
                                   "token_type_ids": rng.integers(0, 2, (1, 6))} for _ in range(3)])
    ctx = _ctx(tmp_path, "data: {val: {reader: npy, path: val}}", "validate: {data: val}")
    config = BenchmarkConfig(batch_sizes=[1, 4], **QUICK)
    rows = benchmark.run({"m": _artifact(path)}, TARGETS, config, ctx)
    for row in rows:
        assert row.status == "ok", row.reason
        assert row.data["source"] == "dataset 'val' (validate.data)"
    batch4 = next(row for row in rows if row.batch_size == 4)
    assert batch4.data["shapes"] == {"input_ids": [4, 6], "token_type_ids": [4, 6]}
    assert batch4.data["distinct_rows"] == 3 and batch4.data["repeated"] is True


def test_integer_inputs_without_data_take_the_graphs_ranges_not_0_to_99(tmp_path: Path) -> None:
    path = _save(token_type_model(), tmp_path / "model.onnx")
    rows = benchmark.run({"m": _artifact(path)}, ["ort:cpu"], BenchmarkConfig(**QUICK), _ctx(tmp_path))
    [row] = rows
    assert row.status == "ok", row.reason
    assert row.data["source"].startswith("seeded random data")
    assert any("'token_type_ids' fed seeded random values in [0, 2)" in note and "table of 2 rows" in note
               for note in row.notes), row.notes
    data = benchmark_data.read_data(_ctx(tmp_path), None, path, [16])
    types = np.concatenate([sample["token_type_ids"].ravel() for sample in data.samples])
    words = np.concatenate([sample["input_ids"].ravel() for sample in data.samples])
    assert set(types.tolist()) == {0, 1}  # both rows of the table, never past it
    assert words.min() >= 0 and words.max() < 200 and len(set(words.tolist())) > 1


def size_and_unknown_model() -> onnx.ModelProto:
    """repeats int64 [2] tiles x (a size: zeros would tile it to an empty tensor); offset int64 [1] is only added
    (the graph does not say what it is)."""
    graph = helper.make_graph(
        [helper.make_node("Tile", ["x", "repeats"], ["tiled"]),
         helper.make_node("ReduceSum", ["tiled"], ["total"], keepdims=0),
         helper.make_node("Cast", ["offset"], ["offset_f"], to=TensorProto.FLOAT),
         helper.make_node("Add", ["total", "offset_f"], ["y"])],
        "sizes",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3]),
         helper.make_tensor_value_info("repeats", TensorProto.INT64, [2]),
         helper.make_tensor_value_info("offset", TensorProto.INT64, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_a_size_input_is_never_zero_and_an_unknown_integer_is(tmp_path: Path) -> None:
    path = _save(size_and_unknown_model(), tmp_path / "model.onnx")
    data = benchmark_data.read_data(_ctx(tmp_path), None, path, [4])
    for sample in data.samples:
        assert sample["repeats"].min() >= 1 and sample["repeats"].max() < 4  # a non-empty tile, every time
        assert not sample["offset"].any()
    assert any("'repeats' fed seeded random values in [1, 4)" in note and "a size" in note for note in data.notes)
    assert any("'offset' fed zeros" in note for note in data.notes)
    [row] = benchmark.run({"m": _artifact(path)}, ["ort:cpu"], BenchmarkConfig(**QUICK), _ctx(tmp_path))
    assert row.status == "ok", row.reason


def test_the_recipes_low_and_high_win_over_the_graphs(tmp_path: Path) -> None:
    path = _save(size_and_unknown_model(), tmp_path / "model.onnx")
    body = """
        name: t
        model:
          onnx: model.onnx
          inputs: [{name: repeats, low: 5, high: 6}]
        variants: {v: []}
        """
    ctx = load_recipe_file(write_recipe(tmp_path, body)).stage_context("*", tmp_path / "work")
    data = benchmark_data.read_data(ctx, None, path, [2])
    assert all((sample["repeats"] == 5).all() for sample in data.samples)
    assert not any("'repeats'" in note for note in data.notes)


def test_a_pooling_model_with_a_dynamic_width_runs_at_the_datas_size(tmp_path: Path) -> None:
    path = _save(pooling_model(), tmp_path / "model.onnx")
    rng = np.random.default_rng(2)
    _write_npz(tmp_path / "val", [{"x": rng.standard_normal((1, 3, 12, 20)).astype(np.float32)} for _ in range(2)])
    ctx = _ctx(tmp_path, "data: {val: {reader: npy, path: val}}", "validate: {data: val}")
    rows = benchmark.run({"m": _artifact(path)}, TARGETS, BenchmarkConfig(batch_sizes=[1, 3], **QUICK), ctx)
    assert [row.status for row in rows] == ["ok"] * 4, [row.reason for row in rows]
    assert rows[1].data["shapes"] == {"x": [3, 3, 12, 20]}


def test_random_data_that_breaks_a_model_says_why(tmp_path: Path) -> None:
    path = _save(pooling_model(), tmp_path / "model.onnx")
    [row] = benchmark.run({"m": _artifact(path)}, ["ort:cpu"], BenchmarkConfig(**QUICK), _ctx(tmp_path))
    assert row.status == "error"
    assert "dynamic axes [2, 3] set to 1 in random data" in row.reason and "validate.data" in row.reason


def test_a_wrong_declared_output_rank_still_benchmarks_and_is_noted(tmp_path: Path) -> None:
    graph = helper.make_graph(
        [helper.make_node("Reshape", ["x", "shape"], ["y"])], "wrong_rank",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],  # the exporter wrote rank 2; it is rank 3
        [numpy_helper.from_array(np.array([-1, 2, 2], np.int64), "shape")])
    path = _save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "model.onnx")
    rows = benchmark.run({"m": _artifact(path)}, TARGETS, BenchmarkConfig(batch_sizes=[1, 2], **QUICK), _ctx(tmp_path))
    for row in rows:
        assert row.status == "ok", row.reason
        assert row.output_shapes == {"y": {"declared": [1, 4], "actual": [row.batch_size, 2, 2]}}
        assert any("output 'y' is declared [1, 4] but the model produces" in note for note in row.notes)


def test_a_static_output_batch_declared_by_the_exporter_still_benchmarks(tmp_path: Path) -> None:
    model = tiny_cnn()  # logits declared [1, 10]
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "batch"  # the input is dynamic, the output not
    path = _save(model, tmp_path / "model.onnx")
    rows = benchmark.run({"m": _artifact(path)}, TARGETS, BenchmarkConfig(batch_sizes=[1, 8], **QUICK), _ctx(tmp_path))
    assert all(row.status == "ok" for row in rows), [row.reason for row in rows]
    calls = {(row.target, row.batch_size): row.timed_call for row in rows}
    assert calls[("ort:cpu", 1)] == TIMED_CALLS["onnxruntime"]  # the declaration holds at batch 1
    assert calls[("ort:cpu", 8)] == TIMED_CALLS["onnxruntime-rebound"]  # bound, yet never held to [1, 10]
    assert calls[("openvino:cpu", 8)] == TIMED_CALLS["openvino"]
    batch8 = [row for row in rows if row.batch_size == 8]
    assert all(row.output_shapes == {"logits": {"declared": [1, 10], "actual": [8, 10]}} for row in batch8)


def test_an_output_listed_twice_benchmarks(tmp_path: Path) -> None:
    value = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "twice",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])], [value, value])
    path = _save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "model.onnx")
    rows = benchmark.run({"m": _artifact(path)}, TARGETS, BenchmarkConfig(**QUICK), _ctx(tmp_path))
    for row in rows:
        assert row.status == "ok", row.reason
        assert row.timed_call in (TIMED_CALLS["onnxruntime"], TIMED_CALLS["openvino"])  # the bound call held


def test_a_static_batch_gives_a_clear_error_row_at_other_sizes(tmp_path: Path) -> None:
    path = _save(tiny_cnn(), tmp_path / "model.onnx")  # input [1, 3, 16, 16]
    rows = benchmark.run({"m": _artifact(path)}, ["ort:cpu"], BenchmarkConfig(batch_sizes=[1, 8], **QUICK),
                         _ctx(tmp_path))
    assert [row.status for row in rows] == ["ok", "error"]
    assert "batch 8 cannot be fed: no input has a dynamic batch dimension (inputs: 'input' [1, 3, 16, 16])" in \
        rows[1].reason and "model.inputs" in rows[1].reason


def test_a_batch_too_large_for_memory_is_refused_before_it_is_built(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    path = _save(token_type_model(), tmp_path / "model.onnx")
    monkeypatch.setattr(benchmark_data, "available_memory_bytes", lambda: 64 * 1024)
    rows = benchmark.run({"m": _artifact(path)}, ["ort:cpu"], BenchmarkConfig(batch_sizes=[1, 4096], **QUICK),
                         _ctx(tmp_path))
    assert rows[0].status == "ok"
    assert rows[1].status == "error"
    assert rows[1].reason.startswith("batch 4096 needs 0.1 MiB for its inputs alone; 0.0 MiB of this")


def test_an_out_of_memory_failure_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _save(tiny_cnn(), tmp_path / "model.onnx")
    from qdeploy.targets import OrtSession

    def allocation_fails(self: Any, feeds: Any) -> Any:
        raise RuntimeError("Failed to allocate memory for requested buffer of size 123456789")

    monkeypatch.setattr(OrtSession, "run", allocation_fails)
    [row] = benchmark.run({"m": _artifact(path)}, ["ort:cpu"], BenchmarkConfig(**QUICK), _ctx(tmp_path))
    assert row.status == "error" and row.reason.startswith("batch 1 does not fit in memory")


def test_numeric_fields_are_bounded_and_max_seconds_fits_the_time_budget() -> None:
    for bad in ({"iterations": 10**12}, {"warmup": 10**9}, {"duration_seconds": 10**6}, {"batch_sizes": [10**7]},
                {"rounds": 10**6}, {"threads": 10**5}, {"max_seconds": 0}, {"batch_sizes": [1, 1]},
                {"batch_sizes": []}, {"duration_seconds": 30, "max_seconds": 10}):
        with pytest.raises(ValidationError):
            BenchmarkConfig(**bad)
    assert BenchmarkConfig().row_budget == DEFAULT_MAX_SECONDS
    assert BenchmarkConfig(duration_seconds=100, warmup_seconds=5).row_budget == 115  # a time budget is honoured


def test_max_seconds_stops_a_long_run_early_and_says_so(tmp_path: Path) -> None:
    path = _save(tiny_cnn(), tmp_path / "model.onnx")
    config = BenchmarkConfig(warmup=5, iterations=10_000_000, rounds=4, max_seconds=0.3)
    started = time.perf_counter()
    [row] = benchmark.run({"m": _artifact(path)}, ["ort:cpu"], config, _ctx(tmp_path))
    assert time.perf_counter() - started < 10
    assert row.status == "ok"
    stop = row.stopped_early
    assert stop is not None and stop.planned_runs == 10_000_000 and stop.runs == row.runs < 10_000_000
    assert row.runs > 10 and stop.seconds_spent == pytest.approx(0.3, abs=0.2)
    assert "stopped early" in stop.reason and stop.reason in row.notes
    unbounded = benchmark.run({"m": _artifact(path)}, ["ort:cpu"], BenchmarkConfig(**QUICK), _ctx(tmp_path))
    assert unbounded[0].stopped_early is None and unbounded[0].runs == 3
