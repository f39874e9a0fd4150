"""Loading a one-file model from its wire format: the same model as onnx.load, its graph without its weights."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from qdeploy.core import onnx_wire
from qdeploy.core.files import external_data_files
from qdeploy.graph.external_data import save_onnx
from tests.helpers.peak import peak_mib


def _model(rng: np.random.Generator) -> onnx.ModelProto:
    """A MatMul on a 64 KB weight, a small bias, an int64 shape and an If whose branch holds its own weight."""
    weight = numpy_helper.from_array(rng.standard_normal((128, 128)).astype(np.float32), "w")
    branch_weight = numpy_helper.from_array(rng.standard_normal((128,)).astype(np.float32), "bw")
    branch = helper.make_graph([helper.make_node("Add", ["m", "bw"], ["t"])], "then", [],
                               [helper.make_tensor_value_info("t", TensorProto.FLOAT, [2, 128])], [branch_weight])
    other = helper.make_graph([helper.make_node("Identity", ["m"], ["e"])], "else", [],
                              [helper.make_tensor_value_info("e", TensorProto.FLOAT, [2, 128])])
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["m"]),
         helper.make_node("If", ["c"], ["y"], then_branch=branch, else_branch=other)], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 128]),
         helper.make_tensor_value_info("c", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 128])],
        [weight, numpy_helper.from_array(np.arange(3, dtype=np.int64), "unused_shape"),
         numpy_helper.from_array(np.ones(4, np.float32), "small")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.fixture(autouse=True)
def _every_file_is_mapped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(onnx_wire, "LOAD_MAPPED_ABOVE", 0)  # small test files take the wire route too


@pytest.mark.parametrize("streamed", [False, True])
def test_a_one_file_model_loads_as_onnx_loads_it(tmp_path: Path, streamed: bool) -> None:
    model = _model(np.random.default_rng(0))
    path = tmp_path / "model.onnx"
    if streamed:  # one graph record per initializer: the reader must follow repeated records
        save_onnx(model, path, threshold=1 << 40)
        from qdeploy.graph import external_data
        external_data._save_streamed(model, path)
    else:
        onnx.save(model, str(path))

    loaded = onnx_wire.load_model(path)

    assert loaded.SerializeToString() == onnx.load(str(path)).SerializeToString()


def test_the_graph_alone_refers_to_its_weights_in_the_file(tmp_path: Path) -> None:
    model = _model(np.random.default_rng(1))
    path = tmp_path / "model.onnx"
    onnx.save(model, str(path))

    graph_only = onnx_wire.load_model(path, load_external_data=False)

    weight = next(t for t in graph_only.graph.initializer if t.name == "w")
    assert weight.data_location == TensorProto.EXTERNAL and not weight.raw_data
    assert {e.key: e.value for e in weight.external_data}["location"] == "model.onnx"
    small = [t for t in graph_only.graph.initializer if t.name in ("small", "unused_shape")]
    assert all(t.data_location == TensorProto.DEFAULT for t in small)  # below 1 KB: kept in the proto
    assert graph_only.ByteSize() < path.stat().st_size // 10
    # ONNX Runtime follows the references from a copy of the graph saved beside the model
    onnx.save(graph_only, str(tmp_path / "graph.onnx"))
    x = np.random.default_rng(2).standard_normal((2, 128)).astype(np.float32)
    y, = ort.InferenceSession(str(tmp_path / "graph.onnx"), providers=["CPUExecutionProvider"]).run(
        None, {"x": x, "c": np.array(False)})
    np.testing.assert_allclose(y, x @ numpy_helper.to_array(model.graph.initializer[0]), rtol=1e-5, atol=1e-5)


def test_a_model_with_a_data_file_lists_that_file_and_never_itself(tmp_path: Path) -> None:
    model = _model(np.random.default_rng(3))
    one_file, split = tmp_path / "one.onnx", tmp_path / "split.onnx"
    onnx.save(model, str(one_file))
    save_onnx(model, split, location="split.weights", threshold=0)

    assert external_data_files(one_file) == []
    assert external_data_files(split) == [tmp_path / "split.weights"]
    assert onnx_wire.load_model(split).SerializeToString() == onnx.load(str(split)).SerializeToString()


def test_a_damaged_file_is_refused_not_read_as_a_model(tmp_path: Path) -> None:
    path = tmp_path / "model.onnx"
    onnx.save(_model(np.random.default_rng(4)), str(path))
    path.write_bytes(path.read_bytes()[:-1000])

    with pytest.raises(Exception, match=r"(?i)pars|decode|error"):
        onnx_wire.load_model(path)


def test_loading_a_one_file_model_holds_one_copy_of_its_weights(tmp_path: Path) -> None:
    """onnx.load holds the file's bytes and the parsed model (two copies) at its peak; this holds one, plus one
    tensor while it is read."""
    weights = [numpy_helper.from_array(np.full((2048, 4096), k, np.float32), f"w{k}") for k in range(8)]  # 8 x 32 MB
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])], weights)
    path = tmp_path / "model.onnx"
    onnx.save(helper.make_model(graph), str(path))
    del weights, graph
    setup = "from pathlib import Path\nfrom qdeploy.core import onnx_wire\n"
    measured = f"""
        model = onnx_wire.load_model(Path({str(path)!r}))
        assert len(model.graph.initializer[7].raw_data) == 2048 * 4096 * 4
    """
    assert peak_mib(tmp_path, setup, measured) < 256 + 100, "the load held a second copy of the 256 MB of weights"


def test_a_model_reached_through_a_symbolic_link_loads(tmp_path: Path) -> None:
    (tmp_path / "store").mkdir()
    real = tmp_path / "store" / "blob"
    onnx.save(_model(np.random.default_rng(5)), str(real))
    link = tmp_path / "model.onnx"
    link.symlink_to(real)

    assert onnx_wire.load_model(link).SerializeToString() == onnx.load(str(real)).SerializeToString()
