"""int8 that computes exactly on every x86 CPU: which operand gives up one bit.

Without VNNI, x86 int8 kernels sum uint8 x int8 pairs into a saturating int16 (``qdeploy/targets/int8_path.py``) unless
one operand stays within 7 bits.  7-bit weights (ONNX Runtime's ``reduce_range``, what oneDNN itself does on
such CPUs) and 7-bit uint8 activations (PyTorch fbgemm's ``reduce_range``) both avoid it; which one costs less
accuracy depends on the model: weights with outlier channels lose more from a coarser weight grid, wide
activation ranges from a coarser activation grid.  With ``reduce_range: auto``, ptq builds both and keeps the one
closer to float32 on the first calibration samples.  Both candidates are free of saturation, so the comparison
gives the same answer whatever CPU builds the artifact; a near tie keeps ONNX Runtime's standard (weights).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from qdeploy.core.compare import compare_outputs
from qdeploy.core.tolerance import Tolerance
from qdeploy.graph.external_data import needs_external_data
from qdeploy.stages.quantize.findings import SevenBitComparison, SevenBitMeasure

if TYPE_CHECKING:
    import onnx

log = logging.getLogger(__name__)

CHOICE_SAMPLES = 8
"""Calibration samples the two 7-bit forms are compared on."""
MARGIN_DB = 0.25
"""7-bit activations must beat 7-bit weights by this much SNR: run-to-run float noise never flips the choice."""
OPENVINO_MARGIN_DB = 1.0
"""The same where the build may put signed activations on int8 (OpenVINO's): 7-bit activations keep every one of
them uint8 with a zero point, which OpenVINO runs slower; the margin signed activations are held to
(``_signed.MARGIN_DB``)."""

Feeds = dict[str, np.ndarray]
Builder = Callable[[list[str]], "onnx.ModelProto"]


def choose_seven_bit(builders: dict[str, Builder], float_model: Path, feeds: list[Feeds], work_dir: Path,
                     margin_db: float = MARGIN_DB) -> tuple[str, SevenBitComparison]:
    """'activations' where 7-bit activations are closer to float32 than 7-bit weights by more than ``margin_db``,
    else 'weights'; and the measurements."""
    feeds = feeds[:CHOICE_SAMPLES]
    measured = measure_builds(builders, float_model, feeds, work_dir)
    chosen = "weights"
    if _snr(measured.get("activations")) > _snr(measured.get("weights")) + margin_db:
        chosen = "activations"
    log.info("quantize: 7-bit %s chosen (%s)", chosen, measured)
    return chosen, SevenBitComparison(compared_on_samples=len(feeds), measured=measured, margin_db=margin_db)


def measure_builds(builders: dict[str, Builder], float_model: Path, feeds: list[Feeds],
                   work_dir: Path) -> dict[str, SevenBitMeasure]:
    """Each builder's fully quantized model against float32 on ``feeds`` (ONNX Runtime): worst SNR and cosine."""
    reference = _outputs(float_model, feeds)
    measured: dict[str, SevenBitMeasure] = {}
    for name, build in builders.items():
        path = work_dir / f"candidate_{name}.onnx"
        _save(build([]), path)
        worst = compare_outputs(reference, _outputs(path, feeds), Tolerance()).worst()
        path.unlink()
        measured[name] = SevenBitMeasure(snr_db=_rounded(worst.get("snr_db")), cosine=_rounded(worst.get("cosine"), 6))
    return measured


def _outputs(path: Path, feeds: list[Feeds]) -> list[dict[str, np.ndarray]]:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    names = [output.name for output in session.get_outputs()]
    return [dict(zip(names, session.run(names, feed), strict=True)) for feed in feeds]


def _save(model: onnx.ModelProto, path: Path) -> None:
    import onnx

    onnx.save(model, str(path), save_as_external_data=needs_external_data(model))


def _snr(measured: SevenBitMeasure | None) -> float:
    value = measured["snr_db"] if measured is not None else None
    return float(value) if value is not None else float("-inf")


def _rounded(value: Any, digits: int = 2) -> float | None:
    return None if value is None else round(float(value), digits)
