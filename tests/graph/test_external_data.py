"""Probes written from a model without copying it: one file, or a graph file plus one data file."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from qdeploy.core.errors import ModelError
from qdeploy.graph.external_data import check_without_weights, save_exposing


@pytest.mark.parametrize("external", [False, True])
def test_a_probe_exposes_inner_tensors_and_leaves_the_model_alone(tmp_path: Path, external: bool) -> None:
    weight = np.random.default_rng(0).standard_normal((32, 32)).astype(np.float32)  # 4 KB: goes to the data file
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Add", ["m", "b"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 32])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 32])],
        [numpy_helper.from_array(weight, "w"), numpy_helper.from_array(np.ones(32, np.float32), "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    before = model.SerializeToString()
    path = tmp_path / "probe.onnx"

    save_exposing(model, path, [helper.make_tensor_value_info("m", TensorProto.FLOAT, [2, 32])], external=external)

    assert model.SerializeToString() == before
    assert (tmp_path / "probe.onnx.data").exists() == external
    assert path.stat().st_size < weight.nbytes if external else path.stat().st_size > weight.nbytes
    x = np.random.default_rng(1).standard_normal((2, 32)).astype(np.float32)
    y, m = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(["y", "m"], {"x": x})
    np.testing.assert_allclose(m, x @ weight, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(y, x @ weight + 1, rtol=1e-5, atol=1e-5)


def _matmul_model(rows: int = 64) -> onnx.ModelProto:
    weight = np.random.default_rng(0).standard_normal((rows, 32)).astype(np.float32)
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, rows])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 32])],
                              [numpy_helper.from_array(weight, "w")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_the_light_checker_passes_a_sound_model_and_leaves_it_alone() -> None:
    model = _matmul_model()
    before = model.SerializeToString()

    check_without_weights(model)

    assert model.SerializeToString() == before


def test_the_light_checker_finds_what_onnxs_checker_finds() -> None:
    broken = _matmul_model()
    broken.graph.node[0].input[0] = "nowhere"  # a node reading a name nothing defines
    with pytest.raises(onnx.checker.ValidationError):
        onnx.checker.check_model(broken)
    with pytest.raises(ModelError, match="not a valid ONNX graph"):
        check_without_weights(broken)


def test_the_light_checker_measures_each_weight_against_its_shape() -> None:
    short = _matmul_model()
    short.graph.initializer[0].raw_data = short.graph.initializer[0].raw_data[:-4]  # one float missing
    with pytest.raises(ModelError, match="initializer 'w' holds 8188 bytes; its type and shape need 8192"):
        check_without_weights(short)


@pytest.mark.parametrize("external", [False, True])
def test_an_instrumented_copy_is_written_file_to_file(tmp_path: Path, external: bool,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from qdeploy.core import onnx_wire
    from qdeploy.graph.external_data import copy_exposing, save_onnx

    monkeypatch.setattr(onnx_wire, "LOAD_MAPPED_ABOVE", 0)  # a small one-file model takes the large-model route
    weight = np.random.default_rng(3).standard_normal((32, 32)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Relu", ["m"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 32])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 32])], [numpy_helper.from_array(weight, "w")])
    source = tmp_path / "src" / "model.onnx"
    source.parent.mkdir()
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    save_onnx(model, source, threshold=0 if external else None)
    path = tmp_path / "copy.onnx"

    copy_exposing(source, path, [onnx.ValueInfoProto(name="m")])

    assert (tmp_path / "copy.onnx.data").stat().st_size == weight.nbytes and path.stat().st_size < weight.nbytes
    x = np.random.default_rng(4).standard_normal((2, 32)).astype(np.float32)
    y, m = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(["y", "m"], {"x": x})
    np.testing.assert_allclose(m, x @ weight, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(y, np.maximum(x @ weight, 0), rtol=1e-5, atol=1e-5)


def test_an_instrumented_copy_of_a_large_model_holds_no_weights(tmp_path: Path) -> None:
    from tests.helpers.peak import peak_mib

    weights = [numpy_helper.from_array(np.full((4096, 4096), k, np.float32), f"w{k}") for k in range(4)]  # 256 MB
    nodes = [helper.make_node("MatMul", ["x" if k == 0 else f"h{k - 1}", f"w{k}"], [f"h{k}"]) for k in range(4)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4096])],
                              [helper.make_tensor_value_info("h3", TensorProto.FLOAT, [1, 4096])], weights)
    source = tmp_path / "model.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(source))
    del weights, graph
    setup = "from pathlib import Path\nimport onnx\nfrom qdeploy.graph.external_data import copy_exposing\n"
    measured = f"""
        copy_exposing(Path({str(source)!r}), Path({str(tmp_path / "copy.onnx")!r}), [onnx.ValueInfoProto(name="h1")])
    """
    assert peak_mib(tmp_path, setup, measured) < 64, "the copy held the weights in memory"
