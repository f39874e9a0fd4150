"""ONNX Runtime loads a new artifact in a child process first (``qdeploy.targets.ort_probe``): a crash while it
optimizes the graph fails that artifact with the reason instead of ending the run without a report (a GRU
tagger's float16 copy ended ``qdeploy run`` with a segmentation fault).  What the fp16 stage then does about it:
tests/stages/fp16/test_fp16_loadable.py."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from qdeploy.targets import ort_probe
from tests.helpers.fresh import crashing_on


def _transposed_matmul(path: Path, elem_type: int = TensorProto.FLOAT) -> Path:
    """x [4, 1, 64] -> Transpose(1, 0, 2) -> MatMul(w [64, 5]) -> y: what a bidirectional GRU's head exports to."""
    numpy_type = helper.tensor_dtype_to_np_dtype(elem_type)
    weight = numpy_helper.from_array(np.random.default_rng(0).standard_normal((64, 5)).astype(numpy_type), "w")
    graph = helper.make_graph([helper.make_node("Transpose", ["x"], ["t"], perm=[1, 0, 2]),
                               helper.make_node("MatMul", ["t", "w"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", elem_type, [4, 1, 64])],
                              [helper.make_tensor_value_info("y", elem_type, [1, 4, 5])], [weight])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)
    return path


def test_a_model_that_loads_says_nothing_and_one_that_fails_says_why(tmp_path: Path) -> None:
    assert ort_probe.load_error(_transposed_matmul(tmp_path / "ok.onnx")) is None
    broken = onnx.load(tmp_path / "ok.onnx")
    broken.graph.initializer[0].CopyFrom(numpy_helper.from_array(np.ones((3, 5), np.float32), "w"))
    onnx.save(broken, tmp_path / "broken.onnx")
    error = ort_probe.load_error(tmp_path / "broken.onnx")
    assert error is not None and "crashed" not in error and "MatMul" in error


def test_a_crash_of_the_child_is_a_reason(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ort_probe, "call_isolated", crashing_on(".onnx", "onnxruntime"))
    error = ort_probe.load_error(_transposed_matmul(tmp_path / "m.onnx"))
    assert error is not None and "crashed" in error and "signal 11" in error and "not a wrong model" in error


def test_a_float16_source_model_onnx_runtime_crashes_on_is_refused_at_export(tmp_path: Path) -> None:
    """The user's own float16 model: ONNX Runtime loads it without optimizations at intake, and crashed the run
    later, where validation loads it with its defaults."""
    from qdeploy.core.errors import ModelError
    from qdeploy.pipeline.recipe.schema import Recipe
    from qdeploy.stages import export

    path = _transposed_matmul(tmp_path / "half.onnx", TensorProto.FLOAT16)
    if ort_probe.load_error(path) is None:
        pytest.skip("this ONNX Runtime loads a float16 batch-transposed MatMul: the crash it guards against is gone")
    recipe = Recipe(name="t", model={"onnx": str(path)}, variants={"v": []})
    ctx = recipe.stage_context("exported", tmp_path / "work")
    ctx.work_dir.mkdir(parents=True, exist_ok=True)
    with pytest.raises(ModelError, match="ONNX Runtime crashed loading it"):
        export.run(None, recipe.model, ctx)


def _scatter_add(path: Path) -> Path:
    """float16 data [4, 3] += updates at rows idx: ScatterElements with reduction 'add' (a graph network's sum)."""
    graph = helper.make_graph([helper.make_node("ScatterElements", ["data", "idx", "upd"], ["y"], axis=0,
                                                reduction="add")], "g",
                              [helper.make_tensor_value_info("data", TensorProto.FLOAT16, [4, 3]),
                               helper.make_tensor_value_info("idx", TensorProto.INT64, [2, 3]),
                               helper.make_tensor_value_info("upd", TensorProto.FLOAT16, [2, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT16, [4, 3])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=8), path)
    return path


def test_a_kernel_that_refuses_at_run_time_fails_only_the_probe_that_runs_a_sample(tmp_path: Path) -> None:
    path = _scatter_add(tmp_path / "m.onnx")
    feed = {"data": np.zeros((4, 3), np.float32), "idx": np.array([[0, 1, 2], [0, 1, 2]], np.int64),
            "upd": np.ones((2, 3), np.float32)}  # floats as a float32 model's samples come: cast to float16
    error = ort_probe.load_error(path, feed)
    if error is None:
        pytest.skip("this ONNX Runtime runs a float16 ScatterElements with a reduction")
    assert ort_probe.load_error(path) is None  # it loads
    assert "running one sample" in error and "ScatterElements" in error
    assert ort_probe.load_error(onnx.load(path), feed) == error  # in memory too
