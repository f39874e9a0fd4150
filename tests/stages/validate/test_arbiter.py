"""A float32 row that fails (the noise floor's, a simplified copy's on any target) is arbitrated by a float64
evaluation of the reference (``_arbiter``): it passes only where ort:cpu's own float32 is what misses the limits."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from qdeploy.core.rows import ValidationRow
from qdeploy.core.tolerance import DEFAULT_TOLERANCES
from qdeploy.stages import validate
from qdeploy.stages.validate import ValidateConfig, _arbiter
from qdeploy.stages.validate._arbiter import Float64Reference, arbitrate
from qdeploy.stages.validate._common import Outcome
from tests.helpers.validate import artifact, by_pair, context


def _sigmoid_head(shift: float, width: int = 8) -> onnx.ModelProto:
    """x [N, width] -> Sigmoid(0.5 x + shift): a wake-word head; with shift -14 its probabilities lie near 1e-6,
    where ONNX Runtime's Sigmoid (accurate to about 5e-8 absolute) is off by tens of percent."""
    nodes = [helper.make_node("Mul", ["x", "half"], ["scaled"]), helper.make_node("Add", ["scaled", "shift"], ["z"]),
             helper.make_node("Sigmoid", ["z"], ["p"])]
    inits = [numpy_helper.from_array(np.float32(0.5), "half"), numpy_helper.from_array(np.float32(shift), "shift")]
    graph = helper.make_graph(nodes, "head", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", width])],
                              [helper.make_tensor_value_info("p", TensorProto.FLOAT, ["N", width])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def test_a_floor_row_that_only_ort_cpus_own_sigmoid_fails_passes_by_float64(tmp_path: Path) -> None:
    """Before: the reference on openvino:cpu (f32, agreeing with float64 to 1e-7) 'failed' at about 10 dB SNR
    against ort:cpu, and the run exited 1."""
    model = _sigmoid_head(-14.0)
    onnx.save(model, tmp_path / "model.onnx")
    artifacts = {"exported": artifact(tmp_path / "ref.onnx", model),
                 "copy": artifact(tmp_path / "copy.onnx", model, ("export", "simplify"))}
    rows = by_pair(validate.run(artifacts, ["ort:cpu", "openvino:cpu"], ValidateConfig(samples=4, localize=False),
                                context(tmp_path)))
    floor = rows[("exported", "openvino:cpu")]
    assert floor.noise_floor and floor.metrics.snr_db is not None and floor.metrics.snr_db < 60  # the premise
    assert floor.status == "passed", floor
    arbitrated = floor.arbitrated
    assert arbitrated is not None and arbitrated["verdict"] == "reference" and arbitrated["samples"] == 2
    assert arbitrated["target"]["passed"] and arbitrated["target"]["snr_db"] > 100
    assert not arbitrated["reference"]["passed"] and arbitrated["reference"]["snr_db"] < 60
    assert any("ort:cpu's own float32 is what is off" in warning for warning in floor.warnings)
    assert rows[("exported", "ort:cpu")].arbitrated is None
    copy = rows[("copy", "openvino:cpu")]  # not the floor: a float32 artifact on the same target
    assert not copy.noise_floor and copy.status == "passed" and copy.arbitrated["verdict"] == "reference"


@pytest.mark.parametrize(("moved", "status"), [(1e-3, "passed"), (0.3, "failed")])
def test_a_copy_on_ort_cpu_as_far_from_float64_as_the_reference_passes(tmp_path: Path, moved: float,
                                                                       status: str) -> None:
    """A score map near 1e-7 (PP-OCRv4 seal det on an image without a seal): a simplified copy whose logits moved by
    1e-3 lands on other rounding steps of ONNX Runtime's Sigmoid (about 20 dB SNR against the original there)
    while both are equally far from float64; it failed on ort:cpu, where nothing arbitrated.  A copy that really
    moved (0.3) stays failed."""
    model = _sigmoid_head(-15.0, width=2048)
    onnx.save(model, tmp_path / "model.onnx")
    artifacts = {"exported": artifact(tmp_path / "ref.onnx", model),
                 "copy": artifact(tmp_path / "copy.onnx", _sigmoid_head(-15.0 + moved, width=2048),
                                  ("export", "simplify"))}
    rows = by_pair(validate.run(artifacts, ["ort:cpu"], ValidateConfig(samples=4, localize=False),
                                context(tmp_path)))
    copy = rows[("copy", "ort:cpu")]
    assert copy.metrics.snr_db is not None and copy.metrics.snr_db < 60  # the premise: it misses against ort:cpu
    assert copy.status == status, copy
    arbitrated = copy.arbitrated
    assert arbitrated is not None and not arbitrated["reference"]["passed"] and not arbitrated["target"]["passed"]
    if status == "passed":
        assert arbitrated["verdict"] == _arbiter.NO_FURTHER
        assert arbitrated["target"]["snr_db"] >= arbitrated["reference"]["snr_db"] - _arbiter.NO_FURTHER_DB
        assert any("no further from float64 than the reference" in warning for warning in copy.warnings)
    else:
        assert arbitrated["verdict"] == "both" and copy.reason


def _failed_floor(outputs: list[dict[str, np.ndarray]]) -> Outcome:
    row = ValidationRow(variant="fp32", target="openvino:cpu", status="failed", noise_floor=True,
                        reason="output 'p': snr_db 40 < snr_db_min 60")
    return Outcome(row, outputs=outputs, tolerance=DEFAULT_TOLERANCES["fp32"])


def _saved_head(tmp_path: Path) -> tuple[Path, list[dict[str, np.ndarray]], list[dict[str, np.ndarray]]]:
    """The head at probabilities near 0.5 (ORT's Sigmoid exact there): its path, feeds and ort:cpu outputs."""
    path = tmp_path / "head.onnx"
    onnx.save(_sigmoid_head(0.0), path)
    feeds = [{"x": np.random.default_rng(seed).standard_normal((1, 8)).astype(np.float32)} for seed in range(3)]
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return path, feeds, [{"p": session.run(None, feed)[0]} for feed in feeds]


def test_a_target_whose_own_float32_is_off_keeps_its_failure(tmp_path: Path) -> None:
    path, feeds, reference = _saved_head(tmp_path)
    off = [{"p": sample["p"] * np.float32(1.01)} for sample in reference]
    outcome = arbitrate(_failed_floor(off), Float64Reference(path, feeds), reference, "the reference variant 'fp32'")
    assert outcome.row.status == "failed"
    assert outcome.row.arbitrated is not None and outcome.row.arbitrated["verdict"] == "target"
    assert outcome.row.arbitrated["reference"]["passed"] and not outcome.row.arbitrated["target"]["passed"]
    assert any(warning.startswith("arbitrated: against float64") for warning in outcome.row.warnings)


def test_a_reference_float64_cannot_evaluate_is_unchecked_never_a_pass(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    path, feeds, reference = _saved_head(tmp_path)
    monkeypatch.setattr(_arbiter, "ARBITER_MAX_BYTES", 10)
    outcome = arbitrate(_failed_floor(reference), Float64Reference(path, feeds), reference, "the reference")
    assert outcome.row.status == "failed"
    assert outcome.row.arbitrated is not None and outcome.row.arbitrated["verdict"] == "unchecked"
    assert "beyond the 0 MB evaluated in float64" in outcome.row.arbitrated["reason"]
    assert any(warning.startswith("not arbitrated") for warning in outcome.row.warnings)
