"""The published folder (artifacts/ and report.*) changes as one unit: a re-run killed anywhere between
publishing and reporting leaves the previous set or the new one, never a report beside files it does not
describe."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.robustness.helpers import BODY, assert_published_consistent, killer, recipe_with_model, run_cli

FAST = BODY.replace("benchmark: {", "benchmark: {enabled: false, ")
CHANGED_FP16 = ("fp16: [simplify, fp16]", "fp16: [simplify, {fp16: {keep_io_types: false}}]")


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One recipe run to the end; each test works on its own copy."""
    folder = tmp_path_factory.mktemp("first")
    recipe = recipe_with_model(folder, body=FAST)
    first = run_cli("run", str(recipe), "-q", "--out", str(folder / "out"))
    assert first.returncode == 0, first.stderr[-2000:]
    return folder


def _copy(finished_run: Path, tmp_path: Path) -> tuple[Path, Path, dict]:
    shutil.copytree(finished_run, tmp_path / "run", symlinks=True)
    recipe, out = tmp_path / "run" / "recipe.yaml", tmp_path / "run" / "out"
    recipe.write_text(recipe.read_text().replace(*CHANGED_FP16))
    report = assert_published_consistent(out)
    assert report is not None
    return recipe, out, report


def _sha(report: dict, name: str) -> str:
    return next(a["sha256"] for a in report["artifacts"] if a["name"] == name)


KILLS_BEFORE_THE_SWITCH = [
    ("qdeploy.pipeline.publish.published", "publish_artifact", "after", 2),  # fp32 in the new set, fp16 not yet
    ("qdeploy.stages.validate", "run", "before", 1),  # every artifact published, no report yet
    ("qdeploy.core.files", "write_text_atomic", "before", 1),  # new report.json written, report.md not
    ("qdeploy.pipeline.publish.published", "_replace_link", "before", 1),  # everything written, just before the switch
]


@pytest.mark.parametrize(("module", "function", "when", "calls"), [  # one kill point on the fast loop
    pytest.param(*kill, id=name, marks=() if name == "before-validate" else pytest.mark.slow)
    for kill, name in zip(KILLS_BEFORE_THE_SWITCH, ["mid-publish", "before-validate", "mid-reports", "before-switch"],
                          strict=True)])
def test_a_rerun_killed_before_the_switch_leaves_the_previous_set(finished_run: Path, tmp_path: Path, module: str,
                                                                  function: str, when: str, calls: int) -> None:
    recipe, out, old = _copy(finished_run, tmp_path)
    old_bytes = (out / "report.json").read_bytes()
    killed = run_cli("run", str(recipe), "-q", "--out", str(out), code=killer(module, function, when, calls))
    assert killed.returncode == -9, killed.stderr[-2000:]
    report = assert_published_consistent(out)
    assert (out / "report.json").read_bytes() == old_bytes and report is not None
    assert _sha(report, "fp16") == _sha(old, "fp16")

    resumed = run_cli("run", str(recipe), "-q", "--out", str(out))
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    new = assert_published_consistent(out)
    assert new is not None and _sha(new, "fp16") != _sha(old, "fp16") and _sha(new, "fp32") == _sha(old, "fp32")
    assert sorted(p.name for p in (out / ".published").iterdir())[0] == "current"
    assert len(list((out / ".published").iterdir())) == 2  # the link and one generation: leftovers are gone


def test_a_rerun_killed_just_after_the_switch_leaves_the_new_set(finished_run: Path, tmp_path: Path) -> None:
    recipe, out, old = _copy(finished_run, tmp_path)
    killed = run_cli("run", str(recipe), "-q", "--out", str(out),
                     code=killer("qdeploy.pipeline.publish.published", "_replace_link", "after", 1))
    assert killed.returncode == -9, killed.stderr[-2000:]
    report = assert_published_consistent(out)
    assert report is not None and _sha(report, "fp16") != _sha(old, "fp16")


def test_a_rerun_that_fails_keeps_the_previous_set(finished_run: Path, tmp_path: Path) -> None:
    recipe, out, _ = _copy(finished_run, tmp_path)
    before = (out / "report.json").read_bytes()
    (recipe.parent / "model.onnx").write_bytes(b"not a model")
    failed = run_cli("run", str(recipe), "-q", "--out", str(out))
    assert failed.returncode == 2, failed.stderr[-2000:]
    assert (out / "report.json").read_bytes() == before
    assert assert_published_consistent(out) is not None
    assert len(list((out / ".published").iterdir())) == 2  # the failed run's set was discarded


def test_an_output_folder_of_an_older_qdeploy_is_taken_over(finished_run: Path, tmp_path: Path) -> None:
    recipe, out, _ = _copy(finished_run, tmp_path)
    shutil.rmtree(out / ".published")
    for name in ("artifacts", "report.json", "report.md", "report.html"):
        (out / name).unlink()
    (out / "artifacts").mkdir()  # the old layout: plain files, some the new run will not write
    (out / "artifacts" / "gone.onnx").write_bytes(b"old")
    (out / "report.json").write_text(json.dumps({"artifacts": [{"name": "gone"}]}))
    result = run_cli("run", str(recipe), "-q", "--out", str(out))
    assert result.returncode == 0, result.stderr[-2000:]
    assert (out / "artifacts").is_symlink() and (out / "report.json").is_symlink()
    report = assert_published_consistent(out)  # gone.onnx went with the old report
    assert report is not None and {a["name"] for a in report["artifacts"]} == {"fp32", "fp16", "int8"}


def test_formats_not_written_leave_no_link_behind(finished_run: Path, tmp_path: Path) -> None:
    recipe, out, _ = _copy(finished_run, tmp_path)
    recipe.write_text(recipe.read_text() + "report: {formats: [json]}\n")
    assert run_cli("run", str(recipe), "-q", "--out", str(out)).returncode == 0
    assert (out / "report.json").is_file()
    assert not (out / "report.md").exists() and not (out / "report.md").is_symlink()
    assert not (out / "report.html").is_symlink()
