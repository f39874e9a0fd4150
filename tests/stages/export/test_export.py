"""The export stage: ONNX files of any opset from 7, external data, shape overrides, PyTorch factories."""

from __future__ import annotations

import pickle
import sys
import textwrap
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from qdeploy.core.context import StageResult
from qdeploy.core.errors import ModelError
from qdeploy.pipeline.recipe.schema import Recipe
from qdeploy.stages import export
from tests.helpers.models import TORCH_NET, tiny_cnn

RNG = np.random.default_rng(5)



def _export(tmp_path: Path, **model: object) -> StageResult:
    recipe = Recipe(name="t", model=model, variants={"v": []})
    ctx = recipe.stage_context("exported", tmp_path / "work")
    ctx.work_dir.mkdir(parents=True, exist_ok=True)
    return export.run(None, recipe.model, ctx)


def _run(model: onnx.ModelProto | str, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    source = model if isinstance(model, str) else model.SerializeToString()
    return ort.InferenceSession(source, providers=["CPUExecutionProvider"]).run(None, feeds)


def _opset9_model() -> onnx.ModelProto:
    """Opset 9: BatchNormalization with its old attributes, Upsample and a Reshape."""
    inits = [numpy_helper.from_array(value.astype(np.float32), name) for name, value in
             (("scale", RNG.uniform(0.5, 1.5, 3)), ("bias", RNG.standard_normal(3)), ("mean", RNG.standard_normal(3)),
              ("var", RNG.uniform(0.5, 1.5, 3)), ("scales", np.array([1, 1, 2, 2])))]
    inits.append(numpy_helper.from_array(np.array([1, -1], np.int64), "flat"))
    nodes = [helper.make_node("BatchNormalization", ["x", "scale", "bias", "mean", "var"], ["bn"], name="bn"),
             helper.make_node("Upsample", ["bn", "scales"], ["up"], name="upsample", mode="nearest"),
             helper.make_node("Reshape", ["up", "flat"], ["y"], name="reshape")]
    graph = helper.make_graph(nodes, "old", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 4, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 192])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 9)])
    model.ir_version = 4
    return model


def test_an_opset_9_model_converts_to_17_and_computes_the_same(tmp_path: Path) -> None:
    model = _opset9_model()
    onnx.save(model, tmp_path / "old.onnx")
    result = _export(tmp_path, onnx=str(tmp_path / "old.onnx"), opset=17)
    assert result.findings.opset_in == 9 and result.findings.opset == 17
    assert "Upsample" not in [node.op_type for node in result.model.graph.node]  # became Resize
    feeds = {"x": RNG.standard_normal((1, 3, 4, 4)).astype(np.float32)}
    np.testing.assert_allclose(_run(result.model, feeds)[0], _run(model, feeds)[0], rtol=1e-6, atol=1e-6)


def test_an_opset_7_model_loads_as_it_is(tmp_path: Path) -> None:
    model = tiny_cnn(opset=7)
    model.ir_version = 3  # which lists every initializer as a graph input too
    model.graph.input.extend(helper.make_tensor_value_info(init.name, init.data_type, list(init.dims))
                             for init in model.graph.initializer)
    onnx.save(model, tmp_path / "m7.onnx")
    result = _export(tmp_path, onnx=str(tmp_path / "m7.onnx"))
    assert result.findings.opset == 7


def test_a_conversion_failure_names_the_op_and_its_node(tmp_path: Path) -> None:
    node = helper.make_node("Mish", ["x"], ["y"], name="mish_1")
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    onnx.save(model, tmp_path / "mish.onnx")
    with pytest.raises(ModelError, match=r"op Mish \(node 'mish_1'\) does not exist at opset 17") as caught:
        _export(tmp_path, onnx=str(tmp_path / "mish.onnx"), opset=17)
    assert "mish.onnx" in str(caught.value)


def test_going_down_an_opset_decomposes_ops_that_do_not_exist_yet(tmp_path: Path) -> None:
    node = helper.make_node("Gelu", ["x"], ["y"], name="gelu")
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])
    model.ir_version = 9
    onnx.save(model, tmp_path / "gelu.onnx")
    result = _export(tmp_path, onnx=str(tmp_path / "gelu.onnx"), opset=17)
    assert result.findings.decomposed_for_opset == {"gelu_to_erf": 1}
    feeds = {"x": RNG.standard_normal((4, 8)).astype(np.float32)}
    np.testing.assert_allclose(_run(result.model, feeds)[0], _run(model, feeds)[0], rtol=1e-5, atol=1e-6)


def test_external_data_is_read_from_beside_the_model(tmp_path: Path) -> None:
    model = tiny_cnn(channels=64)
    onnx.save(model, tmp_path / "ext.onnx", save_as_external_data=True, location="ext.weights", size_threshold=0)
    assert (tmp_path / "ext.weights").stat().st_size > 4000
    result = _export(tmp_path, onnx=str(tmp_path / "ext.onnx"))
    assert all(init.data_location == TensorProto.DEFAULT for init in result.model.graph.initializer)
    feeds = {"input": RNG.standard_normal((1, 3, 16, 16)).astype(np.float32)}
    np.testing.assert_array_equal(_run(result.model, feeds)[0], _run(tiny_cnn(channels=64), feeds)[0])


def test_shape_overrides_fix_a_symbolic_batch_and_set_a_missing_shape(tmp_path: Path) -> None:
    nodes = [helper.make_node("Relu", ["a"], ["ra"]), helper.make_node("Relu", ["b"], ["rb"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("a", TensorProto.FLOAT, ["N", 4]),
                                           helper.make_tensor_value_info("b", TensorProto.FLOAT, None)],
                              [helper.make_tensor_value_info("ra", TensorProto.FLOAT, ["N", 4]),
                               helper.make_tensor_value_info("rb", TensorProto.FLOAT, ["batch", 3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, tmp_path / "m.onnx")
    with pytest.raises(ModelError, match="input 'b' has an unknown rank"):
        _export(tmp_path, onnx=str(tmp_path / "m.onnx"))
    result = _export(tmp_path, onnx=str(tmp_path / "m.onnx"),
                     inputs=[{"name": "a", "shape": [2, 4]}, {"name": "b", "shape": ["batch", 3]}])
    dims = {value.name: [d.dim_value or d.dim_param for d in value.type.tensor_type.shape.dim]
            for value in result.model.graph.input}
    assert dims == {"a": [2, 4], "b": ["batch", 3]}
    with pytest.raises(ModelError, match="rank 3"):
        _export(tmp_path, onnx=str(tmp_path / "m.onnx"), inputs=[{"name": "a", "shape": [1, 2, 3]}])


def _write_net(folder: Path, name: str = "net.py") -> Path:
    path = folder / name
    path.write_text(textwrap.dedent(TORCH_NET))
    return path


@pytest.mark.torch
def test_torch_factory_from_a_file_with_dynamic_batch_and_weights(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    net = _write_net(tmp_path)
    sys.path.insert(0, str(tmp_path))
    try:
        import importlib

        module = importlib.import_module("net")
        trained = module.build()
        with torch.no_grad():
            trained.bn.running_mean.uniform_(-1, 1)
            trained.head.bias.fill_(3.0)
        torch.save(trained.state_dict(), tmp_path / "weights.pt")
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("net", None)
    result = _export(tmp_path, torch={"factory": f"{net}:build", "weights": str(tmp_path / "weights.pt"),
                                      "dynamic": {"x": {0: "batch"}}},
                     inputs=[{"name": "x", "shape": [1, 3, 16, 16]}])
    findings = result.findings.to_report()
    assert findings["source"] == "torch" and findings["exporter"] in ("torchscript", "dynamo")  # auto's pick
    assert 0 <= findings["max_abs_err_vs_torch"] < 1e-4
    assert result.model.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "batch"
    x = RNG.standard_normal((3, 3, 16, 16)).astype(np.float32)  # another batch size works
    with torch.no_grad():
        expected = trained.eval()(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(_run(result.model, {"x": x})[0], expected, rtol=1e-4, atol=1e-4)


@pytest.mark.torch
def test_torch_factory_as_module_and_callable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("torch")
    _write_net(tmp_path, "qdeploy_test_net_module.py")
    monkeypatch.syspath_prepend(str(tmp_path))
    result = _export(tmp_path, torch={"factory": "qdeploy_test_net_module:build"},
                     inputs=[{"name": "x", "shape": [1, 3, 8, 8]}], opset=13)
    assert result.findings.opset == 13 and result.findings.max_abs_err_vs_torch < 1e-4
    with pytest.raises(ModelError, match="has no callable 'missing'"):
        _export(tmp_path, torch={"factory": "qdeploy_test_net_module:missing"},
                inputs=[{"name": "x", "shape": [1, 3, 8, 8]}])


class _Payload:
    """A pickle that would create a folder when unpickled without weights_only."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str]]:
        import os

        return os.mkdir, (str(self.marker),)


@pytest.mark.torch
def test_a_malicious_weights_pickle_is_refused_and_never_runs(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    net = _write_net(tmp_path)
    marker = tmp_path / "pwned"
    with (tmp_path / "evil.pt").open("wb") as stream:
        pickle.dump({"conv.weight": _Payload(marker)}, stream)
    with pytest.raises(ModelError, match="weights_only=True"):
        _export(tmp_path, torch={"factory": f"{net}:build", "weights": str(tmp_path / "evil.pt")},
                inputs=[{"name": "x", "shape": [1, 3, 8, 8]}])
    assert not marker.exists()


@pytest.mark.torch
@pytest.mark.slow
def test_the_dynamo_exporter_is_selectable(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    net = _write_net(tmp_path)
    result = _export(tmp_path, torch={"factory": f"{net}:build", "exporter": "dynamo"},
                     inputs=[{"name": "x", "shape": [2, 3, 8, 8]}])
    assert result.findings.exporter == "dynamo" and result.findings.max_abs_err_vs_torch < 1e-4
    assert [value.name for value in result.model.graph.input] == ["x"]


@pytest.mark.parametrize(("imports", "merged"), [
    ([("", 17), ("", 17)], ["ai.onnx 17 listed 2 times"]),
    ([("ai.onnx", 17), ("", 17)], ["ai.onnx 17 listed 2 times"]),  # one domain under its two names
])
def test_a_domain_imported_twice_at_one_version_is_merged(tmp_path: Path, imports: list, merged: list) -> None:
    """skl2onnx lists ('', 17) twice for a tree ensemble; ONNX Runtime's quantizer then refuses the model ("Failed
    to find proper ai.onnx domain")."""
    model = tiny_cnn()
    del model.opset_import[:]
    model.opset_import.extend(helper.make_opsetid(domain, version) for domain, version in imports)
    onnx.save(model, tmp_path / "m.onnx")
    result = _export(tmp_path, onnx=str(tmp_path / "m.onnx"))
    assert [(entry.domain, entry.version) for entry in result.model.opset_import] == [("", 17)]
    assert result.findings.opset_imports_merged == merged


def test_a_domain_imported_at_two_versions_is_refused_naming_them(tmp_path: Path) -> None:
    model = tiny_cnn()
    model.opset_import.append(helper.make_opsetid("", 13))
    onnx.save(model, tmp_path / "m.onnx")
    with pytest.raises(ModelError, match=r"several versions \(\{'ai.onnx': \[13, 17\]\}\)"):
        _export(tmp_path, onnx=str(tmp_path / "m.onnx"))


def _with_local_function() -> onnx.ModelProto:
    """x [1, 4] -> Block(x) -> y, Block a model-local function (Mul by 2, then Relu), as torch writes a module
    under ``export_modules_as_functions``."""
    block = helper.make_function("__main__", "Block", ["a"], ["b"], [
        helper.make_node("Constant", [], ["two"], value=numpy_helper.from_array(np.float32(2.0))),
        helper.make_node("Mul", ["a", "two"], ["doubled"]), helper.make_node("Relu", ["doubled"], ["b"])],
        [helper.make_opsetid("", 17)])
    graph = helper.make_graph([helper.make_node("Block", ["x"], ["y"], domain="__main__", name="block")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("__main__", 1)],
                              functions=[block])
    model.ir_version = 8
    return model


def test_local_functions_are_inlined_so_openvino_reads_the_model(tmp_path: Path) -> None:
    """Before: OpenVINO could not read any artifact ("No conversion rule found for operations: __main__.Block"),
    and fp16 and int8 did not reach the ops inside."""
    import openvino as ov

    onnx.save(_with_local_function(), tmp_path / "m.onnx")
    result = _export(tmp_path, onnx=str(tmp_path / "m.onnx"))
    assert result.findings.functions_inlined == ["__main__.Block"]
    assert not result.model.functions and {node.op_type for node in result.model.graph.node} >= {"Mul", "Relu"}
    x = np.array([[1.0, -2.0, 0.5, 3.0]], np.float32)
    np.testing.assert_array_equal(_run(result.model, {"x": x})[0], np.maximum(2 * x, 0))
    compiled = ov.Core().compile_model(ov.Core().read_model(result.model.SerializeToString(), b""), "CPU")
    np.testing.assert_allclose(compiled({"x": x})[0], np.maximum(2 * x, 0), rtol=1e-2)


def _weights_listed_as_inputs() -> onnx.ModelProto:
    """x [1, 3, 8, 8] -> Conv(w, b) -> Relu -> y, IR 3 and opset 9 as Caffe2's converter wrote the ONNX model zoo's
    oldest files: every initializer listed among the graph's inputs too (PyTorch's keep_initializers_as_inputs)."""
    rng = np.random.default_rng(0)
    weights = [numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w"),
               numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), "b")]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8]),
              *(helper.make_tensor_value_info(w.name, TensorProto.FLOAT, list(w.dims)) for w in weights)]
    graph = helper.make_graph([helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
                               helper.make_node("Relu", ["c"], ["y"])], "caffe2", inputs,
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])], weights)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 9)])
    model.ir_version = 3
    return model


def test_weights_listed_as_graph_inputs_are_listed_no_more_and_fp16_builds(tmp_path: Path) -> None:
    """Before: float16 conversion of such a model wrote the weights as float16 while their input entries stayed
    float32, and the fp16 stage failed ("Inferred elem type differs from existing elem type: (10) vs (1)")."""
    from qdeploy.stages import fp16
    from qdeploy.stages.fp16 import Fp16Config
    from tests.helpers.fp16 import artifact, context

    onnx.save(_weights_listed_as_inputs(), tmp_path / "m.onnx")
    result = _export(tmp_path, onnx=str(tmp_path / "m.onnx"))
    assert [value.name for value in result.model.graph.input] == ["x"]
    assert result.model.ir_version == 4 and result.findings.ir_version_raised == "3 -> 4"
    assert result.findings.weight_inputs_removed == 2
    x = np.random.default_rng(1).standard_normal((1, 3, 8, 8)).astype(np.float32)
    np.testing.assert_array_equal(_run(result.model, {"x": x})[0], _run(str(tmp_path / "m.onnx"), {"x": x})[0])
    (tmp_path / "half").mkdir()
    half = fp16.run(artifact(tmp_path, result.model, "exported.onnx"), Fp16Config(), context(tmp_path / "half"))
    onnx.checker.check_model(half.model, full_check=True)


def test_a_weight_the_recipe_declares_as_an_input_stays_one(tmp_path: Path) -> None:
    model = _weights_listed_as_inputs()
    model.ir_version = 7  # listing weights as inputs is optional from IR 4 on: no version change
    onnx.save(model, tmp_path / "m.onnx")
    result = _export(tmp_path, onnx=str(tmp_path / "m.onnx"), inputs=[{"name": "b", "shape": [4]}])
    assert [value.name for value in result.model.graph.input] == ["x", "b"]
    assert result.findings.weight_inputs_removed == 1 and result.findings.ir_version_raised is None


def _opset6_average_pool() -> onnx.ModelProto:
    """x [2, 4, 4] -> Unsqueeze -> AveragePool 2x2 -> Squeeze -> y at opset 6, IR 3, as PyTorch 0.3 exported (the
    ONNX wheel's test models): converted, Unsqueeze's and Squeeze's axes become constants the converter also lists
    as graph inputs, which int8's calibration then asked to be fed ("Required inputs (['_v_6']) are missing")."""
    nodes = [helper.make_node("Unsqueeze", ["x"], ["x4"], axes=[0]),
             helper.make_node("AveragePool", ["x4"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("Squeeze", ["p"], ["y"], axes=[0])]
    graph = helper.make_graph(nodes, "torch-jit-export",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 2, 2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 6)])
    model.ir_version = 3
    return model


def test_an_op_version_onnx_runtime_dropped_points_to_model_opset_and_converting_works(tmp_path: Path) -> None:
    onnx.save(_opset6_average_pool(), tmp_path / "m.onnx")
    with pytest.raises(ModelError, match=r"no longer implements AveragePool as defined at opset 1 \(the model imports "
                                         r"opset 6\): set `model.opset: 13`"):
        _export(tmp_path, onnx=str(tmp_path / "m.onnx"))
    result = _export(tmp_path, onnx=str(tmp_path / "m.onnx"), opset=13)
    assert result.model.ir_version == 7 and result.findings.ir_version_raised == "3 -> 7"
    x = np.arange(32, dtype=np.float32).reshape(2, 4, 4)
    np.testing.assert_allclose(_run(result.model, {"x": x})[0], x.reshape(2, 2, 2, 2, 2).mean(axis=(2, 4)))
    from qdeploy.stages import simplify
    from tests.helpers.fp16 import artifact, context

    (tmp_path / "simplify").mkdir()
    simplified = simplify.run(artifact(tmp_path, result.model, "exported.onnx"), simplify.SimplifyConfig(),
                              context(tmp_path / "simplify"))
    assert [value.name for value in simplified.model.graph.input] == ["x"]  # at IR 3 the axes became inputs


def test_the_onnx_wheels_caffe2_squeezenet_loses_its_weight_inputs_and_converts_to_fp16(tmp_path: Path) -> None:
    """A real IR 3 file: the ONNX wheel's light_squeezenet (onnx-caffe2; its weights made by ConstantOfShape, 52
    initializers all listed as inputs)."""
    from qdeploy.stages import fp16
    from qdeploy.stages.fp16 import Fp16Config
    from tests.helpers.fp16 import artifact, context

    source = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light" / "light_squeezenet.onnx"
    result = _export(tmp_path, onnx=str(source))
    assert [value.name for value in result.model.graph.input] == ["data_0"]
    assert result.findings.weight_inputs_removed == 52 and result.findings.ir_version_raised == "3 -> 4"
    (tmp_path / "half").mkdir()
    half = fp16.run(artifact(tmp_path, result.model, "exported.onnx"), Fp16Config(), context(tmp_path / "half"))
    onnx.checker.check_model(half.model, full_check=True)


def _with_sparse_weights() -> onnx.ModelProto:
    """x [4, 16] @ w (a sparse_initializer, linear indices) + b (a Constant's sparse_value, coordinates) -> y."""
    rng = np.random.default_rng(0)
    dense = np.where(rng.random((16, 8)) < 0.8, 0.0, rng.standard_normal((16, 8))).astype(np.float32)
    linear = np.flatnonzero(dense)
    weight = helper.make_sparse_tensor(numpy_helper.from_array(dense.ravel()[linear], "w"),
                                       numpy_helper.from_array(linear.astype(np.int64), "w_indices"), [16, 8])
    bias = helper.make_sparse_tensor(numpy_helper.from_array(np.array([0.5, -1.5], np.float32), "b_values"),
                                     numpy_helper.from_array(np.array([[0, 1], [0, 6]], np.int64), "b_indices"),
                                     [1, 8])
    nodes = [helper.make_node("Constant", [], ["b"], sparse_value=bias), helper.make_node("MatMul", ["x", "w"], ["m"]),
             helper.make_node("Add", ["m", "b"], ["y"])]
    graph = helper.make_graph(nodes, "sparse", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8])])
    graph.sparse_initializer.append(weight)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_sparse_weights_are_written_out_dense_and_fp16_builds(tmp_path: Path) -> None:
    """Before: the fp16 checker refused the model ("existing=tensor_type inferred=sparse_tensor_type") and ptq
    failed inside ONNX Runtime's quantizer ("Graph is not a DAG")."""
    from qdeploy.stages import fp16
    from qdeploy.stages.fp16 import Fp16Config
    from tests.helpers.fp16 import artifact, context

    onnx.save(_with_sparse_weights(), tmp_path / "m.onnx")
    result = _export(tmp_path, onnx=str(tmp_path / "m.onnx"))
    assert result.findings.sparse_weights_densified == ["w", "b"]
    assert not result.model.graph.sparse_initializer
    x = np.random.default_rng(1).standard_normal((4, 16)).astype(np.float32)
    np.testing.assert_array_equal(_run(result.model, {"x": x})[0], _run(str(tmp_path / "m.onnx"), {"x": x})[0])
    (tmp_path / "half").mkdir()
    half = fp16.run(artifact(tmp_path, result.model, "exported.onnx"), Fp16Config(), context(tmp_path / "half"))
    onnx.checker.check_model(half.model, full_check=True)
