"""Outputs past a byte limit wait on disk, read back one array at a time, and compare exactly as in memory."""

from __future__ import annotations

import gc
from pathlib import Path

import numpy as np
import pytest

from qdeploy.core.compare import compare_outputs
from qdeploy.core.output_store import DiskSample, OutputStore
from qdeploy.core.tolerance import Tolerance

RNG = np.random.default_rng(7)


def _sample(noise: float = 0.0) -> dict[str, np.ndarray]:
    logits = RNG.standard_normal((1, 6, 50)).astype(np.float32)
    return {"logits": logits + np.float32(noise) * RNG.standard_normal(logits.shape).astype(np.float32),
            "scores": RNG.standard_normal((1, 10)).astype(np.float32),
            "ids": RNG.integers(0, 9, (1, 4)).astype(np.int64),
            "mask": RNG.random((1, 3)) > 0.5}


def test_samples_past_the_limit_go_to_disk_and_read_back_unchanged(tmp_path: Path) -> None:
    samples = [_sample() for _ in range(4)]
    one = sum(array.nbytes for array in samples[0].values())
    store = OutputStore(tmp_path, keep_bytes=one + 1)
    for sample in samples:
        store.add(sample)
    assert store.samples[0] is samples[0]  # under the limit: kept as given
    assert all(isinstance(sample, DiskSample) for sample in store.samples[1:])
    for kept, given in zip(store.samples, samples, strict=True):
        assert list(kept) == list(given)
        for name, array in given.items():
            assert kept[name].dtype == array.dtype and np.array_equal(kept[name], array)
    folders = list(tmp_path.glob("outputs-*"))
    assert len(folders) == 1 and len(list(folders[0].iterdir())) == 3 * 4
    del store, kept
    gc.collect()
    assert not folders[0].exists()  # gone with the last sample reading from it


def test_without_a_folder_or_for_non_numeric_outputs_everything_stays_in_memory(tmp_path: Path) -> None:
    memory_only = OutputStore(None, keep_bytes=0)
    memory_only.add(_sample())
    strings = OutputStore(tmp_path, keep_bytes=0)
    strings.add({"names": np.array(["a", "b"], dtype=object)})
    assert isinstance(memory_only.samples[0], dict) and isinstance(strings.samples[0], dict)
    assert not list(tmp_path.iterdir())


def test_disk_backed_outputs_compare_exactly_as_in_memory(tmp_path: Path) -> None:
    reference = [_sample() for _ in range(3)]
    candidate = [{name: array + np.asarray(0.01, array.dtype) if array.dtype.kind == "f" else array
                  for name, array in sample.items()} for sample in reference]
    del candidate[1]["scores"]  # a missing output is named the same way
    stored = []
    for samples in (reference, candidate):
        store = OutputStore(tmp_path, keep_bytes=0)
        for sample in samples:
            store.add(sample)
        stored.append(store.samples)
    tolerance = Tolerance(cosine_min=0.99, kl_max=0.5)
    in_memory = compare_outputs(reference, candidate, tolerance).to_dict()
    on_disk = compare_outputs(stored[0], stored[1], tolerance).to_dict()
    assert on_disk == in_memory
    by_name = {out["name"]: out for out in in_memory["outputs"]}
    assert by_name["logits"]["kl"] is not None and by_name["scores"]["shape_mismatch"]


def test_asking_whether_a_sample_holds_an_output_reads_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Comparisons and metrics ask ``name in sample`` before reading it: that must not load the array too."""
    import qdeploy.core.output_store as output_store

    store = OutputStore(tmp_path, keep_bytes=0)
    store.add(_sample())
    loads: list[object] = []
    monkeypatch.setattr(output_store.np, "load", lambda *args, **kwargs: loads.append(args))
    assert "logits" in store.samples[0] and "absent" not in store.samples[0]
    assert not loads
