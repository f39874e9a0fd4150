"""The calibration statistics of ``mode: weight_only`` shared by every data-aware variant of a run (and later runs).

The pass that runs the float model over the calibration data to collect each MatMul input's ``H = X^T X / rows``
(and its max variance, what ``ratio`` ranks by) is most of a data-aware build (about 2 minutes of 2 for scale
estimation on a 135M-parameter decoder). Variants that quantize the same model on the same data (rtn + scale
estimation, gptq, a ratio) read the same statistics: they are stored once in the run's cache folder, keyed by the
SHA-256 of the model file, its external data, the tensor names and every calibration array. A stored file is reused
only when its own SHA-256 matches the one recorded beside it; anything else is recomputed (and said in the log).
Files are written under a temporary name and renamed, so an interrupted write leaves nothing that looks whole.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx

from qdeploy.core.files import sha256_file

__all__ = ["InputStatistics", "cached_statistics", "statistics_key"]

log = logging.getLogger(__name__)


@dataclass
class InputStatistics:
    """What the calibration pass measured of each MatMul input (by tensor name)."""

    hessians: dict[str, np.ndarray]
    """``X^T X / rows``, float32."""
    max_variance: dict[str, float]
    """The largest per-channel variance along a sample's rows, averaged over the samples."""
    samples: int


def statistics_key(source: Path, model: onnx.ModelProto, names: list[str], feeds: list[dict[str, np.ndarray]]
                   ) -> str:
    """SHA-256 over the model file, its external data files, the tensor names and the calibration arrays."""
    digest = hashlib.sha256(b"weight_only-hessians-v2")
    digest.update(sha256_file(source).encode())
    locations = sorted({entry.value for init in model.graph.initializer for entry in init.external_data
                        if entry.key == "location"})
    for location in locations:
        digest.update(location.encode() + sha256_file(source.parent / location).encode())
    digest.update(json.dumps(sorted(names)).encode())
    for feed in feeds:
        for name in sorted(feed):
            array = np.ascontiguousarray(feed[name])
            digest.update(f"{name}:{array.dtype}:{array.shape}".encode())
            digest.update(array.tobytes())
    return digest.hexdigest()


def cached_statistics(source: Path, model: onnx.ModelProto, names: list[str],
                      feeds: Iterable[dict[str, np.ndarray]], compute: Callable[[Iterable[dict[str, np.ndarray]]],
                                                                                  InputStatistics],
                      cache_dir: Path | None) -> tuple[InputStatistics, bool]:
    """The statistics of ``names`` over ``feeds``: read from ``cache_dir`` when a verified copy is there, else
    computed (``compute``) and stored; the flag says whether they were reused."""
    if cache_dir is None:
        return compute(feeds), False
    listed = list(feeds)
    key = statistics_key(source, model, names, listed)
    stored = cache_dir / "weight_only" / f"{key}.npz"
    found = _read(stored, names)
    if found is not None:
        log.info("weight_only: calibration statistics reused (%s)", stored.name[:12])
        return found, True
    computed = compute(listed)
    _write(stored, computed)
    return computed, False


def _read(path: Path, names: list[str]) -> InputStatistics | None:
    record = path.with_suffix(".json")
    if not path.is_file() or not record.is_file():
        return None
    try:
        meta = json.loads(record.read_text())
        if sha256_file(path) != meta["sha256"]:
            log.warning("weight_only: cached calibration statistics %s do not match their hash; recomputing",
                        path.name)
            return None
        with np.load(path) as archive:  # every number in the archive the hash covers
            hessians = {name: archive[f"h{index}"] for index, name in enumerate(meta["names"])}
            variance = {name: float(archive[f"v{index}"]) for index, name in enumerate(meta["names"])}
    except (OSError, ValueError, KeyError) as exc:
        log.warning("weight_only: cached calibration statistics %s unreadable (%s); recomputing", path.name, exc)
        return None
    if not set(names) <= set(hessians) or not set(names) <= set(variance):
        return None
    return InputStatistics(hessians, variance, int(meta["samples"]))


def _write(path: Path, statistics: InputStatistics) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    hessians = statistics.hessians
    names = sorted(hessians)
    temporary = path.with_name(f".tmp-{os.getpid()}-{path.name}")
    try:
        with temporary.open("wb") as stream:
            np.savez(stream, **{f"h{index}": hessians[name] for index, name in enumerate(names)},
                     **{f"v{index}": np.float64(statistics.max_variance[name]) for index, name in enumerate(names)})
        meta = {"sha256": sha256_file(temporary), "names": names, "samples": statistics.samples}
        temporary.replace(path)
        record = path.with_name(f".tmp-{os.getpid()}-{path.stem}.json")
        record.write_text(json.dumps(meta))
        record.replace(path.with_suffix(".json"))
    except OSError as exc:  # a cache that cannot be written costs time, not the build
        log.warning("weight_only: calibration statistics not cached (%s)", exc)
        temporary.unlink(missing_ok=True)
