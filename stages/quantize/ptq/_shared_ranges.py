"""Calibration ranges shared by the builds of one run: ``per_runtime`` builds calibrate once, not once per runtime.

The ONNX Runtime and OpenVINO builds of a variant (``int8@ort``, ``int8@openvino``) quantize the same float model
with the same settings; only where the Q/DQ pairs go differs.  The ranges depend on the float model's bytes, the
calibration samples, the op types around which tensors are calibrated and the method, so the second build reads
the first's ranges from a file in the run's work folder (the parent of each stage's ``work_dir``, kept until the
build phase ends).  Any difference in those inputs is a different file: at worst a build calibrates itself.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypedDict

import numpy as np

__all__ = ["RangeSettings", "shared_calibration"]


class RangeSettings(TypedDict):
    """The settings calibration's ranges depend on besides the model and the samples (part of the file's key)."""

    op_types: list[str]
    method: str
    percentile: float

log = logging.getLogger(__name__)

_FOLDER = "shared-calibration"


def shared_calibration(work_dir: Path, float_model: Path, feeds: Callable[[], Any], settings: RangeSettings,
                       calibrate: Callable[[], tuple[dict[str, tuple[float, float]], Any]]) -> tuple[
                           dict[str, tuple[float, float]], Any]:
    """``calibrate()``'s (ranges, what calibration did), read from this run's earlier build of the same float model,
    calibration samples (``feeds()``: each a mapping of input name -> array) and ``settings`` when there is one,
    else computed and kept for the next build."""
    # lazy: pulls onnxruntime (import cost)
    from qdeploy.stages.quantize.ptq._ptq import Calibrated

    path = work_dir.parent / _FOLDER / f"{_key(float_model, feeds, settings)}.json"
    if path.is_file():
        saved = json.loads(path.read_text())
        log.info("calibration ranges shared with an earlier build of this run (%s)", path.stem[:12])
        return {name: (low, high) for name, (low, high) in saved["ranges"].items()}, Calibrated(**saved["calibrated"])
    ranges, calibrated = calibrate()
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".tmp-{os.getpid()}-{path.name}")
    temporary.write_text(json.dumps({"ranges": {name: [float(low), float(high)] for name, (low, high) in
                                                ranges.items()},
                                     "calibrated": {"samples": calibrated.samples, "tensors": calibrated.tensors,
                                                    "clipped": calibrated.clipped,
                                                    "channel_peaks": calibrated.channel_peaks,
                                                    "nonfinite": calibrated.nonfinite}}))
    os.replace(temporary, path)
    return ranges, calibrated


def _key(float_model: Path, feeds: Callable[[], Any], settings: RangeSettings) -> str:
    """Hash of the float model's files (the model and its data file), the calibration samples and the settings:
    reading the samples costs far less than running the model on them."""
    digest = hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode())
    for sample in feeds():
        for name in sorted(sample):
            array = np.ascontiguousarray(sample[name])
            digest.update(f"{name}:{array.dtype}:{array.shape}".encode())
            digest.update(array.tobytes())
    for path in (float_model, float_model.with_name(f"{float_model.name}.data")):
        if path.is_file():
            with path.open("rb") as handle:
                for block in iter(lambda: handle.read(1 << 20), b""):
                    digest.update(block)
    return digest.hexdigest()
