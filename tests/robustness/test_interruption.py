"""A run killed (SIGKILL) at any point leaves nothing partial that a later run takes for complete;
the next run resumes from the last complete artifact.  Also: two runs at once, and a full disk."""

from __future__ import annotations

import errno
import fcntl
import json
from pathlib import Path

import onnx
import pytest

from qdeploy.pipeline.publish.store import META_FILE
from tests.robustness.helpers import (
    BODY,
    assert_cache_sound,
    assert_published_consistent,
    killer,
    recipe_with_model,
    run_cli,
)

KILL_POINTS = [
    ("qdeploy.stages.export", "run", "after"),
    ("qdeploy.stages.simplify", "run", "after"),
    ("qdeploy.stages.fp16", "run", "before"),
    ("qdeploy.stages.quantize", "run", "after"),
    ("qdeploy.pipeline.publish.store", "save_model", "after"),  # the model is in the staging folder, its sidecar is not
    ("shutil", "copyfile", "after"),  # publishing artifacts/
    ("qdeploy.stages.validate", "run", "before"),
    ("qdeploy.stages.benchmark", "run", "after"),
    ("qdeploy.core.files", "write_text_atomic", "before"),  # writing report.md
]




def assert_nothing_partial_is_complete(out: Path) -> None:
    """Every cache entry with a sidecar matches it; the published folder is one consistent set."""
    assert_cache_sound(out / "cache")
    assert_published_consistent(out)
    for model_path in (out / "artifacts").glob("*.onnx"):
        onnx.checker.check_model(onnx.load(str(model_path)))


@pytest.mark.slow
@pytest.mark.parametrize(("module", "function", "when"), KILL_POINTS)
def test_sigkill_then_resume(tmp_path: Path, module: str, function: str, when: str) -> None:
    recipe = recipe_with_model(tmp_path, body=BODY)
    out = tmp_path / "out"
    killed = run_cli("run", str(recipe), "-q", "--out", str(out), code=killer(module, function, when))
    assert killed.returncode == -9, killed.stderr[-2000:]
    assert_nothing_partial_is_complete(out)
    before = {p.parent.name for p in (out / "cache").glob(f"*/*/{META_FILE}")}

    resumed = run_cli("run", str(recipe), "-q", "--out", str(out))
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert_nothing_partial_is_complete(out)
    report = json.loads((out / "report.json").read_text())
    assert {a["name"] for a in report["artifacts"]} == {"fp32", "fp16", "int8"}
    lineage = {step["key"] for a in report["artifacts"] for step in a["lineage"]}
    reused = {step["key"] for a in report["artifacts"] for step in a["lineage"] if step["cached"]}
    assert before & lineage <= reused  # every artifact completed before the kill is taken, not rebuilt
    assert not list((out / "cache").glob("*/.tmp-*"))  # staging left by the kill was swept
    assert not list(out.glob("artifacts/.tmp-*")) and not list(out.glob(".tmp-*"))  # and temporary files


def test_second_run_into_the_same_folder_is_refused_clearly(tmp_path: Path) -> None:
    recipe = recipe_with_model(tmp_path, body=BODY)
    out = tmp_path / "out"
    out.mkdir()
    with (out / ".qdeploy.lock").open("a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)  # stands for a run in progress
        result = run_cli("run", str(recipe), "-q", "--out", str(out))
    assert result.returncode == 2
    assert "in use by another qdeploy run" in result.stderr and "Traceback" not in result.stderr
    assert not (out / "report.json").exists()


@pytest.mark.slow
def test_two_runs_sharing_one_cache_at_once(tmp_path: Path) -> None:
    import subprocess
    import sys

    recipe = recipe_with_model(tmp_path, body=BODY)
    cache = tmp_path / "cache"
    script = "from qdeploy.cli import main; main()"
    runs = [subprocess.Popen([sys.executable, "-c", script, "run", str(recipe), "-q", "--out",
                              str(tmp_path / f"out{i}"), "--cache-dir", str(cache)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(2)]
    for run in runs:
        _, err = run.communicate(timeout=300)
        assert run.returncode == 0, err[-2000:]
    reports = [json.loads((tmp_path / f"out{i}" / "report.json").read_text()) for i in range(2)]
    assert [a["sha256"] for a in reports[0]["artifacts"]] == [a["sha256"] for a in reports[1]["artifacts"]]
    assert_cache_sound(cache)


@pytest.mark.parametrize("where", [  # one write site on the fast loop; the others the same handling, slow
    pytest.param("qdeploy.pipeline.publish.store.save_model", marks=pytest.mark.slow),
    pytest.param("shutil.copyfile", marks=pytest.mark.slow), "qdeploy.pipeline.publish.store.write_json_synced"])
def test_full_disk_is_reported_and_the_previous_state_kept(tmp_path: Path, where: str) -> None:
    recipe = recipe_with_model(tmp_path, body=BODY.replace("benchmark: {", "benchmark: {enabled: false, "))
    out = tmp_path / "out"
    assert run_cli("run", str(recipe), "-q", "--out", str(out)).returncode == 0
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file() and p.name != ".qdeploy.lock"}
    module, function = where.rsplit(".", 1)
    full_disk = f"""
import errno, importlib
def _full(*args, **kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")
setattr(importlib.import_module({module!r}), {function!r}, _full)
"""
    result = run_cli("run", str(recipe), "-q", "--no-cache", "--out", str(out), code=full_disk)
    assert result.returncode in (1, 2), result.stderr[-2000:]
    assert "no space left on the device" in result.stderr and "Traceback" not in result.stderr
    after = {p: p.read_bytes() for p in out.rglob("*") if p.is_file() and p.name != ".qdeploy.lock"}
    assert after == before  # nothing half-written, nothing lost
    assert errno.ENOSPC == 28
