"""Signed activations for OpenVINO: int8 with zero point 0, or uint8 with a zero point; measured per model.

OpenVINO runs an int8 kernel whose input has a zero point more slowly: profiled per layer on AMX
(``benchmarks/openvino_layers.py``), PP-OCRv4 rec's depthwise, 1x1 and fully connected layers took 5-16% longer per
layer type with uint8 inputs with zero points than with int8 inputs of zero point 0, and ResNet-18's first
convolution 20%.  NNCF quantizes every activation that can be negative symmetrically for that reason.

A range centred on zero (a normalised image, a BatchNorm output) loses almost nothing on int8, so it always goes
there (``_ptq.CENTRED``).  A lopsided one (HardSwish's [-0.375, 6], SiLU's [-0.28, x]) loses up to one bit, and
over a whole model that ranged from nothing to 0.08 of cosine on a SiLU detector (benchmarks/openvino_placement.py;
PP-OCRv4 det and rec: under 0.01).  ``signed_activations: auto`` builds both graphs
and puts the lopsided ones on int8 too unless that is more than ``MARGIN_DB`` further from float32 on the first
calibration samples (the float reference and both graphs run in ONNX Runtime, whose QDQ arithmetic is exact).
"""

from __future__ import annotations

import logging
from pathlib import Path

from qdeploy.stages.quantize.findings import SignedActivationsRecord
from qdeploy.stages.quantize.ptq._ptq import lopsidedness
from qdeploy.stages.quantize.ptq._seven_bit import CHOICE_SAMPLES, Builder, Feeds, measure_builds

log = logging.getLogger(__name__)

MARGIN_DB = 1.0
"""Lopsided ranges go on int8 when that costs at most this much SNR (worst output) against uint8."""


def lopsided(ranges: dict[str, tuple[float, float]], most_lopsided: float) -> bool:
    """Whether a range with negative values is more lopsided than ``most_lopsided`` (``_ptq.signed_int8_overrides``)."""
    return any(low < 0 and lopsidedness(low, high) > most_lopsided for low, high in ranges.values())


def choose_signed(candidates: dict[str, Builder], float_model: Path, feeds: list[Feeds],
                  work_dir: Path) -> tuple[str, SignedActivationsRecord]:
    """'all' (every signed activation on int8) or 'centred' (only those centred on zero), and what was measured."""
    feeds = feeds[:CHOICE_SAMPLES]
    measured, compared = measure_builds(candidates, float_model, feeds, work_dir)
    every, centred = measured["all"]["snr_db"], measured["centred"]["snr_db"]
    chosen = "all" if every is not None and (centred is None or every >= centred - MARGIN_DB) else "centred"
    why = (f"auto: lopsided ranges on int8 too, within {MARGIN_DB:g} dB SNR of uint8 there" if chosen == "all" else
           f"auto: lopsided ranges stay uint8, int8 there is more than {MARGIN_DB:g} dB SNR further from float32")
    log.info("quantize: signed activations on int8: %s (%s)", chosen, measured)
    record = SignedActivationsRecord(setting="auto", symmetric=chosen, why=why, compared_on_samples=len(feeds),
                                     measured=measured)
    if compared is not None:
        record["compared_tensors"] = compared
    return chosen, record
