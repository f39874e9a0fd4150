"""A cache entry is trusted only when every file has the sha256 its sidecar recorded: a damaged entry (bytes
flipped, first bytes garbled, external data changed, sidecar broken) is evicted, rebuilt, and the run says
so; the report's hashes are what `sha256sum` prints for each published file."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import onnx
import pytest

from qdeploy.pipeline.publish.store import META_FILE, MODEL_FILE, ArtifactStore
from tests.helpers.models import tiny_cnn
from tests.robustness.helpers import (
    assert_cache_sound,
    assert_published_consistent,
    recipe_with_model,
    run_cli,
    sha256_of,
)

BODY = """
name: r
model: {onnx: MODEL}
data:
  calib: {reader: random, samples: 4}
variants:
  fp32: [simplify]
  fp16: [simplify, fp16]
  int8: [simplify, {quantize: {calibration: {data: calib}}}]
targets: [ort:cpu]
validate: {reference: fp32, samples: 2}
benchmark: {enabled: false}
"""

SMALL_EXTERNAL_DATA = ("import qdeploy.pipeline.publish.store\n"
                       "qdeploy.pipeline.publish.store.EXTERNAL_DATA_THRESHOLD = 1000\n")
"""Run prelude: models above 1 kB are saved with external data, so the tiny model exercises that path."""


def _flip_middle_4k(path: Path) -> None:
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    data[middle - 2048:middle + 2048] = bytes(byte ^ 0xFF for byte in data[middle - 2048:middle + 2048])
    path.write_bytes(bytes(data))


def _garble_first_40(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[:40] = b"\xde\xad\xbe\xef" * 10
    path.write_bytes(bytes(data))


def _entry_of(out: Path, report: dict, variant: str) -> Path:
    key = next(a["key"] for a in report["artifacts"] if a["name"] == variant)
    return out / "cache" / key[:2] / key


def _first_run(tmp_path: Path, prelude: str = "") -> tuple[Path, Path, dict]:
    model = tiny_cnn(channels=128)  # about 20 kB: room for 4 kB flipped in the middle
    recipe = recipe_with_model(tmp_path, model, body=BODY)
    out = tmp_path / "out"
    first = run_cli("run", str(recipe), "-q", "--out", str(out), code=prelude)
    assert first.returncode == 0, first.stderr[-2000:]
    return recipe, out, assert_published_consistent(out) or {}


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One run to the end; each test damages its own copy."""
    folder = tmp_path_factory.mktemp("first")
    _first_run(folder)
    return folder


@pytest.mark.slow  # whole runs; test_every_read_checks_the_entry evicts and rebuilds through the store on the fast loop
@pytest.mark.parametrize("damage", [_flip_middle_4k, _garble_first_40], ids=["flip-4k-middle", "garble-first-40"])
def test_a_damaged_model_entry_is_evicted_rebuilt_and_reported(finished_run: Path, tmp_path: Path,
                                                               damage: Callable[[Path], None]) -> None:
    shutil.copytree(finished_run, tmp_path / "run", symlinks=True)
    recipe, out = tmp_path / "run" / "recipe.yaml", tmp_path / "run" / "out"
    first = assert_published_consistent(out) or {}
    model_file = _entry_of(out, first, "fp32") / MODEL_FILE
    size = model_file.stat().st_size
    assert size > 8192
    damage(model_file)
    assert model_file.stat().st_size == size  # same size: a size check cannot see it

    again = run_cli("run", str(recipe), "--out", str(out))
    assert again.returncode == 0, again.stderr[-3000:]
    assert "model.onnx: hash mismatch" in again.stderr and "evicted" in again.stderr
    report = assert_published_consistent(out)
    assert report is not None and report["passed"]
    rows = {a["name"]: a for a in report["artifacts"]}
    assert rows["fp32"]["cache"] == "rebuilt: evicted (model.onnx: hash mismatch)"
    assert [step["cached"] for step in rows["fp32"]["lineage"]] == [True, False]  # export reused, simplify rebuilt
    assert "evicted (model.onnx: hash mismatch)" in rows["int8"]["cache"]  # built on the rebuilt entry
    for name, row in rows.items():
        assert row["sha256"] == sha256_of(out / "artifacts" / f"{name}.onnx") == first_sha(first, name)
    assert {(v["variant"], v["status"]) for v in report["validation"] if v["target"] == "ort:cpu"} == {
        ("fp32", "passed"), ("fp16", "passed"), ("int8", "passed")}
    assert_cache_sound(out / "cache")
    assert "cache: rebuilt: evicted (model.onnx: hash mismatch)" in (out / "report.md").read_text()


def first_sha(report: dict, name: str) -> str:
    return next(a["sha256"] for a in report["artifacts"] if a["name"] == name)


@pytest.mark.slow
def test_damaged_external_data_is_evicted_and_each_data_file_hash_is_reported(tmp_path: Path) -> None:
    recipe, out, first = _first_run(tmp_path, SMALL_EXTERNAL_DATA)
    rows = {a["name"]: a for a in first["artifacts"]}
    assert rows["fp32"]["external_data"], "the prelude should make every artifact carry external data"
    weights = _entry_of(out, first, "fp32") / rows["fp32"]["external_data"][0]["file"]
    _flip_middle_4k(weights)

    again = run_cli("run", str(recipe), "--out", str(out), code=SMALL_EXTERNAL_DATA)
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"{weights.name}: hash mismatch" in again.stderr
    report = assert_published_consistent(out)  # checks every external data file's sha256 too
    assert report is not None
    fp32 = next(a for a in report["artifacts"] if a["name"] == "fp32")
    assert fp32["cache"] == f"rebuilt: evicted ({weights.name}: hash mismatch)"
    assert fp32["external_data"] == rows["fp32"]["external_data"]  # the same bytes again
    loaded = onnx.load(str(out / "artifacts" / "fp32.onnx"))  # resolves its external data beside it
    assert sum(init.raw_data != b"" for init in loaded.graph.initializer) >= 1


def _stored_entry(tmp_path: Path) -> tuple[ArtifactStore, str, Path]:
    store = ArtifactStore(tmp_path / "cache")
    key = "ab" * 32
    artifact = store.put(key, tiny_cnn(), {"stage": "export", "stages": ["export"]})
    assert artifact.sha256 == sha256_of(artifact.path)  # the file's own hash, as sha256sum prints it
    return store, key, artifact.path.parent


@pytest.mark.parametrize("damage", ["garbled sidecar", "no per-file hashes", "model missing", "foreign file"])
def test_every_read_checks_the_entry(tmp_path: Path, damage: str) -> None:
    store, key, entry = _stored_entry(tmp_path)
    meta = json.loads((entry / META_FILE).read_text())
    if damage == "garbled sidecar":
        (entry / META_FILE).write_text("{not json")
    elif damage == "no per-file hashes":  # an entry written by an older qdeploy: its hash was never checkable
        del meta["files"]
        (entry / META_FILE).write_text(json.dumps(meta))
    elif damage == "model missing":
        (entry / MODEL_FILE).unlink()
    else:  # a sidecar edited to list a file outside the entry
        meta["external_data"] = ["../../../etc/passwd"]
        (entry / META_FILE).write_text(json.dumps(meta))
    assert store.get(key) is None
    assert key in store.evictions and not entry.exists()
    rebuilt = store.put(key, tiny_cnn(), {"stage": "export", "stages": ["export"]})
    assert store.get(key) == rebuilt.__class__(**{**rebuilt.__dict__, "cached": True})


def test_a_sound_entry_is_read_back_unchanged(tmp_path: Path) -> None:
    store, key, entry = _stored_entry(tmp_path)
    artifact = store.get(key)
    assert artifact is not None and artifact.cached and store.evictions == {}
    meta = json.loads((entry / META_FILE).read_text())
    assert meta["files"] == {MODEL_FILE: {"sha256": sha256_of(entry / MODEL_FILE),
                                          "size_bytes": (entry / MODEL_FILE).stat().st_size}}


def test_samples_rewritten_with_the_same_size_and_mtime_rebuild_what_they_calibrated(tmp_path: Path) -> None:
    """A dataset is fingerprinted by content: other values under the same names, sizes and mtimes must not reuse
    the int8 artifact calibrated on the old ones (it did: the cache key held name, size and mtime only)."""
    import os

    import numpy as np

    from qdeploy.pipeline.recipe.loader import load_recipe_file
    from qdeploy.pipeline.run.runner import RunOptions, run_recipe

    body = BODY.replace("calib: {reader: random, samples: 4}", "calib: {reader: npy, path: calib}")
    recipe = recipe_with_model(tmp_path, tiny_cnn(), body=body)
    calib = tmp_path / "calib"
    calib.mkdir()
    rng = np.random.default_rng(0)
    for index in range(4):
        np.save(calib / f"s{index}.npy", rng.uniform(0, 1, (1, 3, 16, 16)).astype(np.float32))
    options = RunOptions(out_dir=tmp_path / "out", show_progress=False)
    first = {a["name"]: a for a in run_recipe(load_recipe_file(recipe), options).report["artifacts"]}
    for path in sorted(calib.iterdir()):
        stat = path.stat()
        np.save(path, rng.uniform(-50, 50, (1, 3, 16, 16)).astype(np.float32))  # same header, same size
        os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
        assert path.stat().st_size == stat.st_size and path.stat().st_mtime_ns == stat.st_mtime_ns
    second = {a["name"]: a for a in run_recipe(load_recipe_file(recipe), options).report["artifacts"]}
    assert second["fp32"]["cached"] and second["fp32"]["sha256"] == first["fp32"]["sha256"]  # reads no data
    assert not second["int8"]["cached"] and second["int8"]["sha256"] != first["int8"]["sha256"]
