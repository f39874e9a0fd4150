"""Each quantize mode returns its typed findings, and they serialise to the keys the sidecar held before they
were typed (issue 30): the key lists below were recorded from the dict findings on the same tiny models."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from qdeploy.stages import quantize
from qdeploy.stages.accuracy_budget.targets import TargetChecks, TargetPlan, _worst_of
from qdeploy.stages.quantize import QuantizeConfig
from qdeploy.stages.quantize.findings import (
    DynamicFindings,
    LowerFindings,
    PtqFindings,
    QuantizeFindings,
    TargetRecord,
    WeightOnlyFindings,
)
from tests.helpers.lowering import OV_DOMAIN, SHAPE
from tests.helpers.quantize import artifact_at, init, make_model, save_artifact, stage_context, tiny_conv

# sorted(findings) of each mode's sidecar before the findings were typed (dict findings, same models and configs)
INT8_TAIL = ["build_cpu_int8_path", "int8_kernels", "mode", "quantized_nodes"]
PREPARED = ["constants_lifted", "nodes_named", "preprocess"]
SETTINGS = ["activation_type", "compute_nodes", "excluded", "op_types", "per_channel", "reduce_range", "symmetric",
            "weight_type"]
KEYS = {
    "ptq": sorted([*INT8_TAIL, *PREPARED, *SETTINGS, "calibrated_tensors", "calibration_data", "calibration_samples",
                   "method", "ranges_clipped", "signed_activations"]),  # signed_activations: issue 43
    "dynamic": sorted([*INT8_TAIL, *PREPARED, *SETTINGS]),
    "lower": sorted([*INT8_TAIL, "inexact", "lowered", "qdq_parameters_unshared", "refused", "sites",
                     "sites_not_listed", "verification"]),
    "weight_only": ["accuracy_level", "bits", "bytes", "group_size", "kept_float", "method", "mode",
                    "quantized_weights", "scale_estimation", "symmetric", "weight_format", "zero_points"],
}
BUDGET_AT_ONCE = ["confirmed", "cost", "data", "evaluation_seconds", "evaluations", "final", "held_back_samples",
                  "held_back_unseen_by_calibration", "initial", "kept_float", "met", "runtimes", "samples",
                  "search_samples", "seconds", "targets", "time_bound", "tolerance"]
"""The budget's record when the fully quantized model holds at once (no search)."""


def _matmul() -> onnx.ModelProto:
    weight = np.random.default_rng(0).standard_normal((16, 32)).astype(np.float32)
    return make_model([helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")], [init("w", weight)],
                      {"x": [2, 16]}, ["y"])


def _fake_quantized() -> onnx.ModelProto:
    """OpenVINO FakeQuantize on the input: one site that mode lower rewrites into Q/DQ."""
    node = helper.make_node("FakeQuantize", ["x", "il", "ih", "ol", "oh"], ["y"], name="fq", domain=OV_DOMAIN,
                            levels=256)
    high = 255 * 0.05
    return make_model([node], [init("il", 0.0), init("ih", high), init("ol", 0.0), init("oh", high)], {"x": SHAPE},
                      ["y"], domains=(OV_DOMAIN,))


def _gather_matmul(path: Path) -> Path:
    rng = np.random.default_rng(0)
    graph = helper.make_graph(
        [helper.make_node("Gather", ["table", "ids"], ["h"], name="embed"),
         helper.make_node("MatMul", ["h", "w"], ["y"], name="proj")], "g",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, 5])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 5, 64])],
        [numpy_helper.from_array(rng.standard_normal((64, 128)).astype(np.float32), "table"),
         numpy_helper.from_array((rng.standard_normal((128, 64)) * 0.1).astype(np.float32), "w")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


@pytest.mark.parametrize(("mode", "kind"), [("ptq", PtqFindings), ("dynamic", DynamicFindings),
                                            ("lower", LowerFindings), ("weight_only", WeightOnlyFindings)])
def test_each_mode_returns_its_typed_findings_with_the_keys_the_sidecar_had(tmp_path: Path, mode: str,
                                                                            kind: type[QuantizeFindings]) -> None:
    if mode == "weight_only":
        artifact = artifact_at(_gather_matmul(tmp_path / "model.onnx"))
    else:
        artifact = save_artifact(tmp_path, {"ptq": tiny_conv, "dynamic": _matmul, "lower": _fake_quantized}[mode]())
    config = QuantizeConfig(mode=mode, group_size=32) if mode == "weight_only" else QuantizeConfig(mode=mode)
    result = quantize.run(artifact, config, stage_context(tmp_path))
    assert type(result.findings) is kind and result.findings.mode == mode
    assert sorted(result.report()) == KEYS[mode]


def test_the_budget_record_keeps_its_keys_and_its_targets_their_own(tmp_path: Path) -> None:
    config = QuantizeConfig(mode="dynamic", tolerance={"cosine_min": 0.5}, budget={"samples": 4})
    result = quantize.run(save_artifact(tmp_path, _matmul()), config, stage_context(tmp_path))
    assert result.findings.budget is not None and result.findings.budget.met
    assert sorted(result.report()["budget"]) == BUDGET_AT_ONCE
    assert sorted(result.report()) == sorted([*KEYS["dynamic"], "budget"])


def test_a_target_record_reports_the_fields_that_were_set_a_set_none_included() -> None:
    unavailable = TargetRecord(status="unavailable", reason="no GPU here")
    assert unavailable.to_report() == {"status": "unavailable", "reason": "no GPU here"}
    missed = TargetRecord(status="missed", search={"cosine": 0.5, "snr_db": None}, precision=None)
    pinned = TargetRecord(status="confirmed", precision="f32").model_copy(
        update={"deploy_precision": "f32", "default": missed})
    assert pinned.to_report() == {"status": "confirmed", "precision": "f32", "deploy_precision": "f32",
                                  "default": {"status": "missed", "search": {"cosine": 0.5, "snr_db": None},
                                              "precision": None}}
    assert _worst_of(missed) == " (worst cosine 0.5)" and _worst_of(unavailable) == " (no GPU here)"
    assert _worst_of(TargetRecord(status="missed", search={"cosine": None, "snr_db": None})) == " (no metrics)"


def test_the_targets_decide_on_typed_records() -> None:
    """An unavailable target is recorded as such and leaves no verdict to the confirmation (no evaluator)."""
    checks = TargetChecks(search=_NoSearch(), plans=[TargetPlan("ort:cuda", None, "no CUDA device")])
    assert checks.verdicts() == {"ort:cuda": TargetRecord(status="unavailable", reason="no CUDA device")}
    assert checks.all_confirmed() is None and checks.sentence() == "ort:cuda: unavailable (no CUDA device)"


class _NoSearch:
    """The search's evaluator where nothing is measured: only its label is read."""

    label = "ort:cpu"

