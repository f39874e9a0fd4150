"""ptq's choices between whole builds (7-bit weights or activations; signed activations on int8 or not) measure a
detector with NMS inside on the boxes and scores NMS reads (``qdeploy.graph.selection``): measured on what NMS
selected, two builds differed in which boxes they kept, and the SNRs (8.0 and 6.1 dB on this detector) chose 7-bit
weights where the boxes and scores say 7-bit activations are closer to float32."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from qdeploy.stages import quantize
from qdeploy.stages.quantize import CalibrationRef, QuantizeConfig
from tests.helpers.detector import detector_model
from tests.helpers.quantize import npy_folder, save_artifact, stage_context


def _findings(tmp_path: Path, model: onnx.ModelProto | None = None, **settings: object) -> dict[str, Any]:
    config = QuantizeConfig(calibration=CalibrationRef(data="calib"), **settings)
    result = quantize.run(save_artifact(tmp_path, model or detector_model(score_threshold=0.3)), config,
                          stage_context(tmp_path, {"calib": npy_folder(tmp_path, (3, 32, 32), 8, uniform=True)}))
    return result.findings.to_report()


def _lopsided_detector() -> onnx.ModelProto:
    """The detector with its first convolution's output read unrectified, shifted up: a range with negative values
    far from centred, which OpenVINO's build may put on int8 or keep uint8."""
    model = detector_model(score_threshold=0.3)
    next(node for node in model.graph.node if node.name == "head").input[0] = "c1"
    nodes = [node for node in model.graph.node if node.op_type != "Relu"]
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    bias = next(init for init in model.graph.initializer if init.name == "b1")
    bias.CopyFrom(numpy_helper.from_array(np.full(8, 1.5, np.float32), "b1"))
    return model


def test_the_seven_bit_choice_measures_the_tensors_nms_reads(tmp_path: Path) -> None:
    record = _findings(tmp_path, reduce_range="auto")["reduce_range"]
    assert record["compared_tensors"] == ["decoded", "class_scores"]
    snrs = {form: measure["snr_db"] for form, measure in record["measured"].items()}
    assert min(snrs.values()) > 25, snrs  # int8 boxes and scores, not which boxes NMS kept (about 6-8 dB)
    assert record["seven_bit"] == ("activations" if snrs["activations"] > snrs["weights"] + 0.25 else "weights")
    assert not list((tmp_path / "work").glob("candidate_*")) and not list((tmp_path / "work").glob("*_compared*"))


def test_the_signed_choice_measures_them_too(tmp_path: Path) -> None:
    record = _findings(tmp_path, _lopsided_detector(), runtime="openvino", reduce_range=False,
                       signed_activations="auto")["signed_activations"]
    if "measured" not in record:
        pytest.skip(f"no lopsided range to decide on here: {record['why']}")
    assert record["compared_tensors"] == ["decoded", "class_scores"]
    assert min(measure["snr_db"] for measure in record["measured"].values()) > 20


def test_a_build_that_lacks_a_compared_tensor_is_measured_on_its_outputs(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    from qdeploy.stages.quantize.ptq import _seven_bit

    monkeypatch.setattr(_seven_bit, "comparable_tensors", lambda model: ["decoded", "not_in_the_build"])
    record = _findings(tmp_path, reduce_range="auto")["reduce_range"]
    assert "compared_tensors" not in record and set(record["measured"]) == {"weights", "activations"}
    assert not list((tmp_path / "work").glob("candidate_*"))
