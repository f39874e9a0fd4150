"""PTQ on real models nobody here wrote: PP-OCRv4 detection and recognition (Paddle exports, opset 12,
weights in Constant nodes), calibrated through the image-folder reader on rendered text.

The models come from the rapidocr-onnxruntime wheel through ``tests.real_models`` (``QDEPLOY_REAL_MODELS``);
the tests are skipped, saying why, when they cannot be had.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from qdeploy.calibration import data_context
from qdeploy.calibration.samples import iter_samples
from qdeploy.pipeline.recipe.schema import DatasetSpec
from qdeploy.stages import quantize
from qdeploy.stages.quantize import CalibrationRef, QuantizeConfig
from tests.helpers.images import text_images
from tests.helpers.quantize import artifact_at, cosine, run_ort
from tests.real_models import PP_OCR_DET, PP_OCR_REC, real_model

# name: (model, image width, height, normalisation)
CASES = {
    "det": (PP_OCR_DET, 320, 320, {"mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225]}),
    "rec": (PP_OCR_REC, 320, 48, {"mean": [0.5, 0.5, 0.5], "std": [0.5, 0.5, 0.5]}),
}




@pytest.mark.slow
@pytest.mark.parametrize("which", list(CASES))
def test_pp_ocr_model_is_quantized_with_int8_kernels_on_both_runtimes(tmp_path: Path, which: str) -> None:
    relative, width, height, normalisation = CASES[which]
    source = real_model(relative)
    text_images(tmp_path / "calib", 6, width, height, seed=1)
    text_images(tmp_path / "eval", 3, width, height, seed=2)
    specs = {name: DatasetSpec(reader="images", path=name, resize=[height, width], **normalisation)
             for name in ("calib", "eval")}
    work = tmp_path / "work"
    work.mkdir()
    context = data_context(which, work, datasets=specs, resolve=lambda p: tmp_path / p)
    result = quantize.run(artifact_at(source), QuantizeConfig(calibration=CalibrationRef(data="calib", samples=6)),
                          context)

    findings = result.findings
    assert findings.constants_lifted > 300  # the Paddle weights, quantized only once they are initializers
    assert findings.opset == "converted from 12 to 13"
    assert findings.calibration_samples == 6
    convs = findings.quantized_nodes["Conv"]
    assert convs >= 30
    for target in ("ort:cpu", "openvino:cpu"):
        counted = findings.int8_kernels[target]
        assert counted["int8"] >= convs * 0.9, (target, counted)

    feeds = list(iter_samples(specs["eval"], source, resolve=lambda p: tmp_path / p, dataset_name="eval"))
    for feed in feeds:
        assert cosine(run_ort(result.model, feed)[0], run_ort(source, feed)[0]) > 0.85
