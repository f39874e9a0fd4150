"""Issue 28: one chain of hashes from a run to its package.  report.json records each artifact's and sidecar's
sha256, SHA256SUMS lists everything published, `qdeploy package` and `open_run` verify both before reading, and
a package's tolerances come from the run's recipe snapshot, not from report.json's editable rows."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

import qdeploy
from qdeploy.core.errors import QdeployError, QdeployInputError
from qdeploy.pipeline.publish.package.publish import package_from_run
from qdeploy.pipeline.recipe.loader import load_recipe_file
from qdeploy.pipeline.run.runner import RunOptions, run_recipe
from tests.robustness.helpers import RECIPE, assert_clean_input_error, recipe_with_model, run_cli, sha256_of


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One finished run (with packages) for the module; each test tampers with its own copy."""
    folder = tmp_path_factory.mktemp("chain")
    recipe = recipe_with_model(folder, body=RECIPE + "report: {packages: {which: passed}}\n")
    result = run_recipe(load_recipe_file(recipe), RunOptions(out_dir=folder / "out", show_progress=False))
    assert result.exit_code == 0, result.report["failures"]
    return result.out_dir


def copy_of(run_dir: Path, tmp_path: Path) -> tuple[Path, Path]:
    """A copy of the run folder (links kept) and the real folder of its published artifacts."""
    copy = Path(shutil.copytree(run_dir, tmp_path / "run", symlinks=True, ignore=shutil.ignore_patterns("cache")))
    return copy, (copy / "artifacts").resolve()


def edit_report(run: Path, edit: Any) -> None:
    path = (run / "report.json").resolve()
    report = json.loads(path.read_text())
    edit(report)
    path.write_text(json.dumps(report))


def regenerate_sums(artifacts: Path) -> None:
    """What someone covering their tracks would do: SHA256SUMS made again from the files as they are now."""
    names = sorted(p.name for p in artifacts.iterdir() if p.name != "SHA256SUMS")
    (artifacts / "SHA256SUMS").write_text("".join(f"{sha256_of(artifacts / n)}  {n}\n" for n in names))


def test_report_records_sidecar_hashes_and_sha256sums_lists_every_published_file(run_dir: Path) -> None:
    artifacts = (run_dir / "artifacts").resolve()
    report = json.loads((run_dir / "report.json").read_text())
    listed = {line.split("  ", 1)[1] for line in (artifacts / "SHA256SUMS").read_text().splitlines()}
    for row in report["artifacts"]:
        sidecar = artifacts / Path(row["sidecar"]).name
        assert row["sidecar_sha256"] == sha256_of(sidecar)
        assert {f"{row['name']}.onnx", sidecar.name} <= listed
    assert listed == {p.name for p in artifacts.iterdir()} - {"SHA256SUMS"}  # everything published
    done = subprocess.run(["sha256sum", "-c", "SHA256SUMS"], cwd=artifacts, capture_output=True, text=True)
    assert done.returncode == 0 and "int8.json: OK" in done.stdout, done.stdout + done.stderr
    assert (run_dir / "recipe.snapshot.json").is_file()


def test_fp32_over_int8_with_sums_regenerated_is_refused_by_package(run_dir: Path, tmp_path: Path) -> None:
    """It was packaged as int8: report.json's sha256 was never compared."""
    copy, artifacts = copy_of(run_dir, tmp_path)
    shutil.copyfile(artifacts / "fp32.onnx", artifacts / "int8.onnx")
    regenerate_sums(artifacts)
    done = run_cli("package", str(copy), "--target", "ort:cpu", "--variant", "int8", "--out", str(tmp_path / "d"))
    assert_clean_input_error(done, "artifacts/int8.onnx changed since the run", "run the recipe again")
    assert not (tmp_path / "d" / "ort-cpu-int8").exists()


def test_an_edited_sidecar_is_refused(run_dir: Path, tmp_path: Path) -> None:
    copy, artifacts = copy_of(run_dir, tmp_path)
    sidecar = artifacts / "int8.json"
    sidecar.write_text(sidecar.read_text().replace('"variant": "int8"', '"variant": "fp32"'))
    regenerate_sums(artifacts)
    with pytest.raises(QdeployInputError, match=r"artifacts/int8\.json changed since the run") as caught:
        package_from_run(copy, "ort:cpu", ["int8"], tmp_path / "d")
    assert caught.value.exit_code == 2


def test_a_tolerance_loosened_in_report_json_is_refused(run_dir: Path, tmp_path: Path) -> None:
    """It flowed straight into the package's check."""
    copy, _ = copy_of(run_dir, tmp_path)

    def loosen(report: dict[str, Any]) -> None:
        for row in report["validation"]:
            row["tolerance"] = {"cosine_min": 0.1}
            for output in row.get("outputs") or []:
                output["tolerance"] = {"cosine_min": 0.1}

    edit_report(copy, loosen)
    with pytest.raises(QdeployError, match="not the one the run's recipe gives") as caught:
        package_from_run(copy, "ort:cpu", ["int8"], tmp_path / "d")
    assert caught.value.exit_code == 2 and not (tmp_path / "d" / "ort-cpu-int8").exists()


@pytest.mark.parametrize("tamper", ["edit", "remove"])
def test_an_edited_or_removed_recipe_snapshot_is_refused(run_dir: Path, tmp_path: Path, tamper: str) -> None:
    copy, _ = copy_of(run_dir, tmp_path)
    snapshot = (copy / "recipe.snapshot.json").resolve()
    if tamper == "edit":  # a looser validate.tolerance, to be read by the package
        body = json.loads(snapshot.read_text())
        body["validate"]["tolerance"] = {"cosine_min": 0.1}
        snapshot.write_text(json.dumps(body))
    else:
        snapshot.unlink()
    words = "section validate differs from the hash" if tamper == "edit" else "recipe.snapshot.json is missing"
    with pytest.raises(QdeployError, match=words) as caught:
        package_from_run(copy, "ort:cpu", ["int8"], tmp_path / "d")
    assert caught.value.exit_code == 2


def test_the_manifest_records_the_run_and_where_its_tolerances_come_from(run_dir: Path, tmp_path: Path) -> None:
    [folder] = package_from_run(run_dir, "ort:cpu", ["int8"], tmp_path / "d")
    manifest = json.loads((folder / "manifest.json").read_text())
    run = manifest["made_by"]["run"]
    assert run["report_sha256"] == sha256_of(run_dir / "report.json")
    assert Path(run["folder"]) == run_dir.resolve()
    assert manifest["check"]["tolerances"] == {"logits": {"cosine_min": 0.98, "snr_db_min": 15.0}}
    assert "recipe.snapshot.json" in manifest["check"]["tolerances_from"]
    report = json.loads((run_dir / "report.json").read_text())
    written = {row["variant"]: row for row in report["packages"]["written"]}
    made = run_dir / "packages" / "ort-cpu-int8" / "manifest.json"  # made by the run: the report records it
    assert written["int8"]["manifest_sha256"] == sha256_of(made)


def test_open_run_verifies_the_files_it_describes(run_dir: Path, tmp_path: Path) -> None:
    assert qdeploy.open_run(run_dir).passed
    copy, artifacts = copy_of(run_dir, tmp_path)
    model = artifacts / "fp32.onnx"
    model.write_bytes(model.read_bytes()[:-1] + bytes([model.read_bytes()[-1] ^ 1]))  # same size, one bit
    with pytest.raises(QdeployInputError, match=r"artifacts/fp32\.onnx changed since the run"):
        qdeploy.open_run(copy)
    model.unlink()
    with pytest.raises(QdeployInputError, match=r"artifacts/fp32\.onnx is missing"):
        qdeploy.open_run(copy)


def test_compare_can_verify_a_run_and_accepts_a_report_that_stands_alone(run_dir: Path, tmp_path: Path) -> None:
    """verify_published as `qdeploy compare` calls it: a report.json copied on its own is numbers only."""
    from qdeploy.pipeline.publish.verify import verify_published

    alone = tmp_path / "report.json"
    shutil.copyfile(run_dir / "report.json", alone)
    assert verify_published(alone, require_artifacts=False).artifacts
    with pytest.raises(QdeployInputError, match="give the whole run folder"):
        verify_published(alone)
    copy, artifacts = copy_of(run_dir, tmp_path)
    (artifacts / "SHA256SUMS").write_text("")
    with pytest.raises(QdeployInputError, match=r"SHA256SUMS does not list int8\.json"):
        verify_published(copy, require_artifacts=False)


def test_qdeploy_compare_refuses_a_tampered_run_folder(run_dir: Path, tmp_path: Path) -> None:
    copy, artifacts = copy_of(run_dir, tmp_path)
    shutil.copyfile(artifacts / "fp32.onnx", artifacts / "int8.onnx")
    regenerate_sums(artifacts)
    done = run_cli("compare", str(run_dir), str(copy))
    assert_clean_input_error(done, "artifacts/int8.onnx changed since the run", "run the recipe again")


def test_check_py_fails_on_a_changed_byte_and_says_precision_as_a_word(run_dir: Path, tmp_path: Path) -> None:
    from qdeploy.pipeline.publish.package import check as package_check

    package = Path(shutil.copytree(run_dir / "packages" / "ort-cpu-int8", tmp_path / "p"))
    model = package / "model.onnx"
    data = bytearray(model.read_bytes())
    data[-1] ^= 1
    model.write_bytes(bytes(data))
    problems = package_check.verify_files(package, json.loads((package / "manifest.json").read_text()))
    assert len(problems) == 1 and problems[0].startswith("model.onnx: sha256") and "differs" in problems[0]

    class OldType:  # an OpenVINO Type without get_type_name prints itself like this
        def __str__(self) -> str:
            return "<Type: 'bfloat16'>"

    assert package_check.precision_word(OldType()) == "bf16"
    import openvino

    assert [package_check.precision_word(t) for t in (openvino.Type.f32, openvino.Type.bf16)] == ["f32", "bf16"]
