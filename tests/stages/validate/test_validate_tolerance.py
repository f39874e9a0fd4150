"""A model that arrives already quantized is held to the int8 tolerance in every variant, and the row says why."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import onnx

import qdeploy.stages.validate as validate
from qdeploy.core.tolerance import DEFAULT_TOLERANCES
from qdeploy.stages.validate import ValidateConfig
from qdeploy.stages.validate._tolerance import integer_ops, tolerance_precision
from tests.helpers.fp16 import prequantized_model
from tests.helpers.validate import artifact, by_pair, chain_model, context


def _rows(tmp_path: Path, model: onnx.ModelProto, config: ValidateConfig) -> dict:
    artifacts = {"exported": artifact(tmp_path / "ref.onnx", model),
                 "simplified": artifact(tmp_path / "same.onnx", model, stages=("export", "simplify"))}
    return by_pair(validate.run(artifacts, ["ort:cpu", "openvino:cpu"], config, context(tmp_path)))


def test_pre_quantized_fp32_variant_gets_the_int8_tolerance_and_the_reason(tmp_path: Path) -> None:
    model = prequantized_model(tmp_path)
    rows = _rows(tmp_path, model, ValidateConfig(samples=3))
    int8 = DEFAULT_TOLERANCES["int8"].model_dump(exclude_none=True)
    for (variant, target), row in rows.items():
        assert row.tolerance == int8, (variant, target)
        assert "ConvInteger x1" in row.tolerance_basis and "DynamicQuantizeLSTM x1" in row.tolerance_basis
        assert row.tolerance_basis in row.warnings  # the report lists a row's warnings
    openvino = rows[("simplified", "openvino:cpu")]  # the runtimes round the integer ops differently...
    assert openvino.metrics.snr_db < DEFAULT_TOLERANCES["fp32"].snr_db_min
    assert openvino.status == "passed"  # ...which is no failure of a variant that changed nothing


def test_a_pre_quantized_models_device_default_row_keeps_the_int8_tolerance(tmp_path: Path) -> None:
    """The float32 model at OpenVINO's default precision (bf16 on these CPUs, f32 elsewhere) is held to the looser
    of that precision's limits and the int8 ones its integer ops call for.  Before: a QDQ model's device-default
    row was held to bf16's (cosine 0.995) while the same model pinned to f32 was held to int8's."""
    model = prequantized_model(tmp_path)
    exported = artifact(tmp_path / "ref.onnx", model)
    artifacts = {"exported": exported, "exported@default": dataclasses.replace(exported, at_device_default=True)}
    rows = by_pair(validate.run(artifacts, ["ort:cpu", "openvino:cpu"], ValidateConfig(samples=2),
                                context(tmp_path)))
    row = rows[("exported@default", "openvino:cpu")]
    assert row.tolerance == DEFAULT_TOLERANCES["int8"].model_dump(exclude_none=True)
    assert "integer ops" in row.tolerance_basis


def test_float_models_and_written_tolerances_are_unchanged(tmp_path: Path) -> None:
    rows = _rows(tmp_path, chain_model(), ValidateConfig(samples=2))
    assert all(row.tolerance == DEFAULT_TOLERANCES["fp32"].model_dump(exclude_none=True)
               and row.tolerance_basis is None for row in rows.values())
    written = {"cosine_min": 0.5}
    quantized = prequantized_model(_mkdir(tmp_path / "q"))
    rows = _rows(tmp_path / "q", quantized, ValidateConfig(samples=2, tolerance=written))
    assert all(row.tolerance == written and row.tolerance_basis is None for row in rows.values())


def _mkdir(path: Path) -> Path:
    path.mkdir()
    return path


def test_integer_ops_are_counted_in_subgraphs_and_int8_artifacts_keep_their_own_basis(tmp_path: Path) -> None:
    from onnx import helper, numpy_helper

    inner = helper.make_graph([helper.make_node("DequantizeLinear", ["q", "s"], ["y"], name="dq")], "then", [],
                              [helper.make_tensor_value_info("y", 1, [2])])
    outer = helper.make_graph([helper.make_node("If", ["c"], ["y"], then_branch=inner, else_branch=inner)], "g",
                              [helper.make_tensor_value_info("c", onnx.TensorProto.BOOL, [])],
                              [helper.make_tensor_value_info("y", 1, [2])],
                              [numpy_helper.from_array(np.array([1, 2], np.int8), "q"),
                               numpy_helper.from_array(np.array(0.5, np.float32), "s")])
    path = tmp_path / "if.onnx"
    onnx.save(helper.make_model(outer, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    assert integer_ops(path) == {"DequantizeLinear": 2}
    assert tolerance_precision("fp16", path)[0] == "int8"
    assert tolerance_precision("int8", path) == ("int8", "")
