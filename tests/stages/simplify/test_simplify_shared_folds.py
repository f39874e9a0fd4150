"""Folding never stores a second copy of a large weight: a large fold of a large initializer that other nodes
still read (a tied embedding's ``Transpose`` for the LM head) is skipped; an only reader, or a small weight, folds."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from qdeploy.calibration import data_context
from qdeploy.stages.simplify import _folding as folding
from qdeploy.stages.simplify._shared_folds import SHARED_FOLD_MIN_BYTES
from tests.helpers.simplify import simplify_model

ROWS, WIDTH = 512, 1024  # 2 MiB of float32: above SHARED_FOLD_MIN_BYTES


def _tied(rows: int = ROWS, width: int = WIDTH, *, gather: bool = True) -> onnx.ModelProto:
    """ids -> Gather(E) -> MatMul(., Transpose(E)): the table read twice, once through a Transpose."""
    table = np.random.default_rng(0).standard_normal((rows, width)).astype(np.float32)
    nodes = [helper.make_node("Transpose", ["E"], ["Et"], name="head_t", perm=[1, 0])]
    if gather:
        nodes += [helper.make_node("Gather", ["E", "ids"], ["h"], name="embed"),
                  helper.make_node("MatMul", ["h", "Et"], ["logits"], name="head")]
        inputs = [helper.make_tensor_value_info("ids", TensorProto.INT64, ["n"])]
    else:
        nodes += [helper.make_node("MatMul", ["x", "Et"], ["logits"], name="head")]
        inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", width])]
    graph = helper.make_graph(nodes, "tied", inputs,
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["n", rows])],
                              [numpy_helper.from_array(table, "E")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _stored(model: onnx.ModelProto) -> int:
    return sum(int(np.prod(init.dims)) * 4 for init in model.graph.initializer)


def test_a_large_transpose_of_a_shared_table_is_not_folded() -> None:
    assert ROWS * WIDTH * 4 >= SHARED_FOLD_MIN_BYTES
    model = _tied()
    report = folding.fold_constants(model, limit_bytes=64 << 20)
    assert [node.op_type for node in model.graph.node] == ["Transpose", "Gather", "MatMul"]
    assert _stored(model) == ROWS * WIDTH * 4 and report.folded_nodes == 0
    assert report.skipped == [{"tensor": "Et", "bytes": ROWS * WIDTH * 4, "reason": "Transpose of 'E', which "
                               "other nodes read too: folding would store a second copy"}]


def test_the_only_reader_folds_and_replaces_the_table() -> None:
    model = _tied(gather=False)
    report = folding.fold_constants(model, limit_bytes=64 << 20)
    assert [node.op_type for node in model.graph.node] == ["MatMul"] and not report.skipped
    read = [init for init in model.graph.initializer if init.name in model.graph.node[0].input]
    assert [list(init.dims) for init in read] == [[WIDTH, ROWS]]  # E is unread now: the stage's passes drop it


def test_a_small_shared_table_still_folds() -> None:
    model = _tied(rows=16, width=8)
    report = folding.fold_constants(model, limit_bytes=64 << 20)
    assert [node.op_type for node in model.graph.node] == ["Gather", "MatMul"] and not report.skipped


def test_the_stage_keeps_one_copy_and_the_same_outputs(tmp_path: Path) -> None:
    model = _tied()
    ctx = data_context("v", tmp_path / "work")
    ctx.work_dir.mkdir()
    result = simplify_model(model, tmp_path, ctx, fold_size_limit_mb=64)
    assert _stored(result.model) == ROWS * WIDTH * 4
    assert any("second copy" in entry["reason"] for entry in result.findings.to_report()["fold_skipped"])
    ids = {"ids": np.array([0, 7, 511], np.int64)}
    before, after = (ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, ids)[0]
                     for m in (model, result.model))
    np.testing.assert_allclose(after, before, rtol=1e-6, atol=1e-6)
