"""Bad models: every one stops the run with exit 2 and a message naming the file, node or tensor."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.helpers.models import tiny_cnn
from tests.robustness.helpers import assert_clean_input_error, recipe_with_model, run_cli


def _single_op(op: str, domain: str = "", *, input_shape: list[int] | None = None) -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, input_shape)
    if input_shape is None:
        x = helper.make_tensor_value_info("x", TensorProto.FLOAT, None)
    node = helper.make_node(op, ["x"], ["y"], name="the_node", domain=domain)
    graph = helper.make_graph([node], "g", [x], [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    opsets = [helper.make_opsetid("", 17)] + ([helper.make_opsetid(domain, 1)] if domain else [])
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = 8
    return model


def test_not_onnx(tmp_path: Path) -> None:
    recipe = recipe_with_model(tmp_path, b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 4)
    assert_clean_input_error(run_cli("run", str(recipe), "-q", "--out", str(tmp_path / "o")), "model.onnx")


def test_truncated(tmp_path: Path) -> None:
    data = tiny_cnn().SerializeToString()
    recipe = recipe_with_model(tmp_path, data[: len(data) // 2])
    assert_clean_input_error(run_cli("run", str(recipe), "-q", "--out", str(tmp_path / "o")), "model.onnx")


def test_invalid_graph(tmp_path: Path) -> None:
    model = tiny_cnn()
    model.graph.node[0].input[1] = "no_such_tensor"
    recipe = recipe_with_model(tmp_path, model)
    assert_clean_input_error(run_cli("run", str(recipe), "-q", "--out", str(tmp_path / "o")), "no_such_tensor")


def test_unsupported_opset(tmp_path: Path) -> None:
    model = tiny_cnn()
    model.opset_import[0].version = 99
    recipe = recipe_with_model(tmp_path, model)
    assert_clean_input_error(run_cli("run", str(recipe), "-q", "--out", str(tmp_path / "o")), "opset 99")


def test_custom_op_no_runtime_knows(tmp_path: Path) -> None:
    recipe = recipe_with_model(tmp_path, _single_op("MyOp", "com.acme", input_shape=[1, 4]))
    assert_clean_input_error(run_cli("run", str(recipe), "-q", "--out", str(tmp_path / "o")),
                             "the_node", "MyOp", "com.acme")


def test_input_of_unknown_rank(tmp_path: Path) -> None:
    recipe = recipe_with_model(tmp_path, _single_op("Relu"))
    assert_clean_input_error(run_cli("run", str(recipe), "-q", "--out", str(tmp_path / "o")),
                             "input 'x' has an unknown rank", "model.inputs")


def test_missing_external_data(tmp_path: Path) -> None:
    model = tiny_cnn()
    onnx.save(model, tmp_path / "model.onnx", save_as_external_data=True, location="weights.bin", size_threshold=0)
    (tmp_path / "weights.bin").unlink()
    recipe = recipe_with_model(tmp_path, (tmp_path / "model.onnx").read_bytes())
    assert_clean_input_error(run_cli("run", str(recipe), "-q", "--out", str(tmp_path / "o")), "weights.bin",
                             "missing")


@pytest.mark.parametrize("location", ["../outside.bin", "/etc/passwd", "link.bin"])
def test_external_data_outside_the_model_folder_is_refused(tmp_path: Path, location: str) -> None:
    folder = tmp_path / "model"
    folder.mkdir()
    (tmp_path / "outside.bin").write_bytes(np.zeros(1024, np.float32).tobytes())
    if location == "link.bin":
        (folder / "link.bin").symlink_to(tmp_path / "outside.bin")
    weight = numpy_helper.from_array(np.zeros((4, 4), np.float32), "w")
    weight.ClearField("raw_data")
    weight.data_location = TensorProto.EXTERNAL
    weight.external_data.add(key="location", value=location)
    node = helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])], [weight])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    recipe = recipe_with_model(folder, model)
    result = run_cli("run", str(recipe), "-q", "--out", str(tmp_path / "o"))
    assert_clean_input_error(result, "outside the model's folder", "'w'")


def test_size_cap_stops_before_loading(tmp_path: Path) -> None:
    from tests.robustness.helpers import RECIPE

    body = RECIPE.replace("model: {onnx: MODEL}", "model: {onnx: MODEL, max_size_mb: 0.001}")
    recipe = recipe_with_model(tmp_path, body=body)
    assert_clean_input_error(run_cli("run", str(recipe), "-q", "--out", str(tmp_path / "o")), "above the cap",
                             "max_size_mb")
