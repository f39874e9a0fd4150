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
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from qdeploy.core.compare import compare_outputs
from qdeploy.core.onnx_wire import load_model
from qdeploy.core.tolerance import Tolerance
from qdeploy.graph.external_data import copy_exposing, needs_external_data, save_exposing, save_onnx
from qdeploy.graph.selection import comparable_tensors
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
    measured, compared = measure_builds(builders, float_model, feeds, work_dir)
    chosen = "weights"
    if _snr(measured.get("activations")) > _snr(measured.get("weights")) + margin_db:
        chosen = "activations"
    log.info("quantize: 7-bit %s chosen (%s)", chosen, measured)
    record = SevenBitComparison(compared_on_samples=len(feeds), measured=measured, margin_db=margin_db)
    if compared is not None:
        record["compared_tensors"] = compared
    return chosen, record


def measure_builds(builders: dict[str, Builder], float_model: Path, feeds: list[Feeds],
                   work_dir: Path) -> tuple[dict[str, SevenBitMeasure], list[str] | None]:
    """Each builder's fully quantized model against float32 on ``feeds`` (ONNX Runtime): worst SNR and cosine; and
    the tensors compared instead of the outputs, where the outputs pass through a selection whose length depends
    on the data (``qdeploy.graph.selection``: the boxes and scores an in-graph NMS reads), else None."""
    compared = comparable_tensors(load_model(float_model, load_external_data=False))
    if compared is not None:
        try:
            return _measure(builders, float_model, feeds, work_dir, compared), compared
        except _NotComputed as missing:
            log.info("quantize: a build does not compute %s; its outputs are compared instead", missing)
    return _measure(builders, float_model, feeds, work_dir, None), None


class _NotComputed(Exception):
    """A build lacks a tensor the comparison reads."""


def _measure(builders: dict[str, Builder], float_model: Path, feeds: list[Feeds], work_dir: Path,
             compared: list[str] | None) -> dict[str, SevenBitMeasure]:
    reference: list[dict[str, np.ndarray]] | None = None
    measured: dict[str, SevenBitMeasure] = {}
    for name, build in builders.items():  # one build in memory at a time
        path = work_dir / f"candidate_{name}.onnx"
        model = build([])
        if compared is None:
            save_onnx(model, path)  # a large build's weights in <name>.data, which _remove deletes
        else:
            missing = set(compared) - {output for node in model.graph.node for output in node.output}
            if missing:
                raise _NotComputed(sorted(missing))
            present = {output.name for output in model.graph.output}
            save_exposing(model, path, _untyped(name for name in compared if name not in present),
                          external=needs_external_data(model))
        del model
        if reference is None:  # once a build computes what the comparison reads
            reference = _reference(float_model, feeds, compared, work_dir)
        worst = compare_outputs(reference, _outputs(path, feeds, compared), Tolerance()).worst()
        _remove(path)
        measured[name] = SevenBitMeasure(snr_db=_rounded(worst.get("snr_db")), cosine=_rounded(worst.get("cosine"), 6))
    return measured


def _reference(float_model: Path, feeds: list[Feeds], compared: list[str] | None,
               work_dir: Path) -> list[dict[str, np.ndarray]]:
    """The float32 model's outputs, or the ``compared`` tensors of a copy that exposes them."""
    if compared is None:
        return _outputs(float_model, feeds, None)
    probe = work_dir / "reference_compared.onnx"
    copy_exposing(float_model, probe, _untyped(compared))
    try:
        return _outputs(probe, feeds, compared)
    finally:
        _remove(probe)


def _outputs(path: Path, feeds: list[Feeds], names: list[str] | None) -> list[dict[str, np.ndarray]]:
    """The tensors ``names`` (outputs of the model), or all its outputs, on ``feeds``."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    fetched = names or [output.name for output in session.get_outputs()]
    return [dict(zip(fetched, session.run(fetched, feed), strict=True)) for feed in feeds]


def _untyped(names: Iterable[str]) -> list[onnx.ValueInfoProto]:
    """Graph outputs by name only: ONNX Runtime types them."""
    import onnx

    return [onnx.ValueInfoProto(name=name) for name in names]


def _remove(path: Path) -> None:
    """A model file and the data file ``save_exposing`` or ``copy_exposing`` wrote beside it."""
    path.unlink(missing_ok=True)
    path.with_name(path.name + ".data").unlink(missing_ok=True)


def _snr(measured: SevenBitMeasure | None) -> float:
    value = measured["snr_db"] if measured is not None else None
    return float(value) if value is not None else float("-inf")


def _rounded(value: Any, digits: int = 2) -> float | None:
    return None if value is None else round(float(value), digits)
