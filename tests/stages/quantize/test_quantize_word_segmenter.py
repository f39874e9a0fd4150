"""Plain int8 of a real tf2onnx Keras text CNN: PyThaiNLP's DeepCut word segmenter (issue 40, class 4).

Two float inputs of character and character-type ids -> Cast -> Gather embeddings -> Conv1D branches, each with a
per-step Dense and a ZeroPadding1D, merged by element-wise Max -> Concat with the embeddings -> BatchNormalization
-> Dense -> Sigmoid.  Fed the segmenter's own features of Thai Wikipedia titles (both out of the pythainlp wheel,
through ``tests.real_models``).  Before the mixed-range Concat was left float its default int8 gave cosine 0.88 on
ort:cpu and 0.28 on openvino:cpu, where NNCF's gave 0.999 and 0.998.  Weights are 7-bit (``reduce_range`` auto),
so ONNX Runtime's int8 products do not saturate on AVX2-only CPUs either.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from qdeploy.stages import quantize
from qdeploy.stages.quantize import CalibrationRef, QuantizeConfig
from tests.helpers.quantize import artifact_at, cosine, run_openvino, run_ort, stage_context
from tests.real_models import THAI_TITLES, WORD_SEGMENTER, WORD_SEGMENTER_SOURCE, real_model
from tests.real_recipes.data import word_segmenter_features

CHARACTERS = 64


@pytest.mark.slow
@pytest.mark.parametrize("runtime", [None, "openvino"])
def test_the_word_segmenters_default_int8_holds_on_both_runtimes(tmp_path: Path, runtime: str | None) -> None:
    source = real_model(WORD_SEGMENTER)
    code, titles = real_model(WORD_SEGMENTER_SOURCE), real_model(THAI_TITLES)
    calib = tmp_path / "calib"
    calib.mkdir()
    for index, sample in enumerate(word_segmenter_features(code, titles, 16, CHARACTERS, seed=1)):
        np.savez(calib / f"s{index:02d}.npz", **sample)
    config = QuantizeConfig(calibration=CalibrationRef(data="calib"), verify_targets=[], runtime=runtime)
    result = quantize.run(artifact_at(source), config, stage_context(tmp_path, {"calib": calib}))

    assert result.findings.float_concats and len(result.findings.float_concats) == 1
    feeds = word_segmenter_features(code, titles, 4, CHARACTERS, seed=2)
    reference = np.concatenate([run_ort(source, feed)[0] for feed in feeds])
    boundaries = reference > 0.5
    assert 0.05 < boundaries.mean() < 0.6  # real text: some characters start a word, most do not
    for outputs in ([run_ort(result.model, feed)[0] for feed in feeds],
                    [run_openvino(result.model, feed, tmp_path)[0] for feed in feeds]):
        quantized = np.concatenate(outputs)
        assert cosine(reference, quantized) > 0.98
        assert ((quantized > 0.5) == boundaries).mean() > 0.97  # the word boundaries it finds
