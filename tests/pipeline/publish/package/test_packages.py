"""Issue 18, deployable packages: what `qdeploy run` and `qdeploy package` write, loaded where qdeploy cannot be
imported, and checked against the run's reference outputs; a changed byte is caught."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest

from qdeploy.core.compare import compare_outputs
from qdeploy.core.tolerance import Tolerance
from qdeploy.pipeline.publish.package import PackageError, build_package, source_from_report, write_manifest
from qdeploy.pipeline.publish.package import check as package_check
from qdeploy.pipeline.publish.package.data import CheckData
from qdeploy.pipeline.publish.package.publish import chosen_pairs, stored_check_data
from qdeploy.pipeline.recipe.loader import load_recipe_file
from qdeploy.pipeline.run.runner import RunOptions, run_recipe
from tests.helpers.models import REPO, tiny_cnn, write_recipe
from tests.helpers.packages import SITES, without_qdeploy
from tests.helpers.reports import report_with

RECIPE = """
    name: pkg
    model:
      onnx: tiny.onnx
    data:
      val: {reader: random, samples: 8, seed: 3}
    variants:
      fp32: [simplify]
      fp16: [simplify, {fp16: {keep_io_types: true}}]
      int8: [simplify, {quantize: {mode: ptq, calibration: {data: val}, per_runtime: false}}]
    targets: [ort:cpu, openvino:cpu, ort:cuda]
    validate: {data: val, reference: fp32, samples: 8}
    benchmark: {batch_sizes: [1], warmup: 1, iterations: 5, rounds: 1, busy_seconds: 0, device_default: false}
    report: {packages: {which: passed}}
    """
PAIRS = {(variant, target) for variant in ("fp32", "fp16", "int8") for target in ("ort:cpu", "openvino:cpu")}
"""Every pair passes (tests/pipeline/run/test_device_default.py packages fp32@default, a row only bf16 CPUs have)."""


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("pkg")
    onnx.save(tiny_cnn(), folder / "tiny.onnx")
    recipe = write_recipe(folder, RECIPE)
    result = run_recipe(load_recipe_file(recipe), RunOptions(out_dir=folder / "out", show_progress=False))
    assert result.exit_code == 0, result.report["failures"]
    return result.out_dir


def report_of(run_dir: Path) -> dict[str, Any]:
    return json.loads((run_dir / "report.json").read_text())


def test_run_writes_one_checked_package_per_passed_artifact_and_target(run_dir: Path) -> None:
    report = report_of(run_dir)
    written = {(row["variant"], row["target"]): row for row in report["packages"]["written"]}
    assert set(written) == PAIRS  # ort:cuda is unavailable here: no package for it
    assert report["packages"]["failed"] == [] and report["packages"]["check_samples"] == 8  # all validated
    for (variant, target), row in written.items():
        folder = run_dir / "packages" / f"{target.replace(':', '-')}-{variant}"
        assert Path(row["path"]) == folder and row["checked"]
        manifest = json.loads((folder / "manifest.json").read_text())
        assert package_check.verify_files(folder, manifest) == []
        assert manifest["inputs"] == [{"name": "input", "type": "float", "shape": [1, 3, 16, 16]}]
        assert manifest["validation"]["status"] == "passed" and manifest["latency"]["latency_ms"]["p50"] > 0
        assert manifest["runtime_version"] and manifest["qdeploy_version"] == "0.1.0"
        if target == "openvino:cpu":
            assert manifest["model"]["compress_to_fp16"] is False  # the IR holds the weights validation ran
            assert json.loads((folder / "runtime.json").read_text())["properties"]["INFERENCE_PRECISION_HINT"]
        else:
            artifact = run_dir / "artifacts" / f"{variant}.onnx"
            assert (folder / "model.onnx").read_bytes() == artifact.read_bytes()
    check_data = report["packages"]["check_data"]
    assert check_data["file"] == "packages/reference-check.npz"
    assert package_check.sha256_file(run_dir / check_data["file"]) == check_data["sha256"]


def test_fp32_ir_keeps_float32_weights(run_dir: Path) -> None:
    """openvino.save_model compresses to fp16 by default; an fp32 package must not (it would drift)."""
    fp32 = (run_dir / "packages" / "openvino-cpu-fp32" / "model.bin").stat().st_size
    fp16 = (run_dir / "packages" / "openvino-cpu-fp16" / "model.bin").stat().st_size
    assert fp32 > 1.8 * fp16


def test_every_package_passes_its_check_where_qdeploy_cannot_be_imported(run_dir: Path) -> None:
    folders = sorted(path for path in (run_dir / "packages").iterdir() if path.is_dir())
    assert len(folders) == len(PAIRS)
    for folder in folders:
        done = without_qdeploy(folder, "--require-no-qdeploy")
        assert done.returncode == 0, f"{folder.name}:\n{done.stdout}{done.stderr}"
        assert "qdeploy importable: no" in done.stdout and done.stdout.rstrip().endswith("PASS")
        assert "over 8 samples" in done.stdout


def test_the_independence_proof_can_fail(run_dir: Path) -> None:
    """The same check under this test's interpreter, where qdeploy is importable, refuses: the proof is real."""
    done = subprocess.run([sys.executable, "check.py", "--require-no-qdeploy"], cwd=run_dir / "packages" /
                          "ort-cpu-fp32", capture_output=True, text=True, timeout=300)
    assert done.returncode == 1 and "can import" in done.stdout


def test_package_outputs_equal_the_reports_reference_on_fp32(run_dir: Path) -> None:
    """The fp32 ORT package reproduces the stored reference outputs exactly (same model, same runtime)."""
    folder = run_dir / "packages" / "ort-cpu-fp32"
    manifest = json.loads((folder / "manifest.json").read_text())
    run, _ = package_check.ort_runner(folder, json.loads((folder / "runtime.json").read_text()), "model.onnx",
                                      ["logits"])
    feeds = package_check.load_samples(folder / "check" / "inputs.npz")
    reference = package_check.load_samples(folder / "check" / "reference.npz")
    assert len(feeds) == 8 and manifest["check"]["compares_with"] == "variant 'fp32' on ort:cpu"
    for feed, expected in zip(feeds, reference, strict=True):
        np.testing.assert_array_equal(run(feed)["logits"], expected["logits"])


def copy_package(run_dir: Path, name: str, tmp_path: Path) -> Path:
    return Path(shutil.copytree(run_dir / "packages" / name, tmp_path / name))


def test_a_changed_byte_of_any_file_is_named(run_dir: Path, tmp_path: Path) -> None:
    source = run_dir / "packages" / "openvino-cpu-int8"
    names = list(json.loads((source / "manifest.json").read_text())["files"])
    assert {"model.xml", "model.bin", "runtime.json", "check.py", "check/inputs.npz"} <= set(names)
    for name in names:
        folder = Path(shutil.copytree(source, tmp_path / name.replace("/", "_")))
        data = bytearray((folder / name).read_bytes())
        data[len(data) // 2] ^= 0x01
        (folder / name).write_bytes(bytes(data))
        problems = package_check.verify_files(folder, json.loads((folder / "manifest.json").read_text()))
        assert problems == [f"{name}: sha256 {package_check.sha256_file(folder / name)} differs from the "
                            f"manifest's {json.loads((source / 'manifest.json').read_text())['files'][name]['sha256']}"]
    done = without_qdeploy(tmp_path / "model.bin")
    assert done.returncode == 1 and "FAIL: files: model.bin: sha256" in done.stdout


def test_an_extra_or_missing_file_is_named(run_dir: Path, tmp_path: Path) -> None:
    folder = copy_package(run_dir, "ort-cpu-int8", tmp_path)
    manifest = json.loads((folder / "manifest.json").read_text())
    (folder / "runtime.json").unlink()
    (folder / "model.extra.onnx").write_bytes(b"x")
    assert package_check.verify_files(folder, manifest) == ["runtime.json: missing",
                                                            "model.extra.onnx: not in the manifest"]


def test_outputs_that_drift_from_the_reference_fail_the_check(run_dir: Path, tmp_path: Path) -> None:
    """Negative control with consistent checksums: only the numbers can tell (reference scaled by 1.1)."""
    folder = copy_package(run_dir, "openvino-cpu-fp32", tmp_path)
    reference = package_check.load_samples(folder / "check" / "reference.npz")
    np.savez(folder / "check" / "reference.npz", **{f"{i}/{k}": v * 1.1 for i, sample in enumerate(reference)
                                                     for k, v in sample.items()})
    manifest = json.loads((folder / "manifest.json").read_text())
    del manifest["files"]
    write_manifest(folder, manifest)
    done = without_qdeploy(folder)
    assert done.returncode == 1, done.stdout
    assert "FAIL: model.xml: output logits: SNR" in done.stdout and "< snr_db_min 60" in done.stdout


def test_a_package_that_fails_its_check_is_never_published(run_dir: Path, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    report = report_of(run_dir)
    source = source_from_report(report, "int8", "ort:cpu", run_dir / "artifacts" / "int8.onnx")
    monkeypatch.setattr(package_check, "check_outputs", lambda *args: ["output logits: cosine 0.5 < 0.98"])
    out = tmp_path / "dist"
    with pytest.raises(PackageError, match=r"failed its check: model\.onnx: output logits: cosine 0\.5"):
        build_package(source, out, CheckData(feeds=[{}], reference=[{}]))
    assert list(out.iterdir()) == []  # no package, no staging folder left behind


def test_ort_optimized_model_is_extended_level_and_checked(run_dir: Path, tmp_path: Path) -> None:
    report = report_of(run_dir)
    source = source_from_report(report, "int8", "ort:cpu", run_dir / "artifacts" / "int8.onnx")
    folder = build_package(source, tmp_path, stored_check_data(run_dir, report), ort_optimized=True)
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["model"]["optimized"]["level"] == "ORT_ENABLE_EXTENDED"
    assert "model.extended.onnx" in manifest["files"]
    done = without_qdeploy(folder)
    assert done.returncode == 0 and "model.extended.onnx on onnxruntime" in done.stdout, done.stdout


@pytest.mark.parametrize("name", ["ort-cpu-fp16", "openvino-cpu-int8"])
def test_manifest_snippet_runs(run_dir: Path, name: str) -> None:
    folder = run_dir / "packages" / name
    snippet = json.loads((folder / "manifest.json").read_text())["snippet"]
    code = f"import sys; sys.path += {SITES!r}\n{snippet}\nprint({{k: v.shape for k, v in outputs.items()}})"
    done = subprocess.run([sys.executable, "-I", "-S", "-c", code], cwd=folder, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "{'logits': (1, 10)}"


def test_check_metrics_agree_with_validation() -> None:
    """check.py's standalone metrics are qdeploy's: same numbers, same verdict under the same limits."""
    rng = np.random.default_rng(0)
    for scale in (1e-4, 1e-2, 0.3):
        reference = [{"y": rng.standard_normal((2, 10)).astype(np.float32)} for _ in range(3)]
        candidate = [{"y": (s["y"] + scale * rng.standard_normal((2, 10))).astype(np.float32)} for s in reference]
        for limits in ({"cosine_min": 0.999, "snr_db_min": 30.0}, {"atol": 0.01}, {"atol": 0.01, "rtol": 0.05},
                       {"top1_agreement_min": 0.9}):
            ours = compare_outputs(reference, candidate, Tolerance(**limits)).outputs[0]
            found, broken = package_check.output_metrics([s["y"] for s in reference], [s["y"] for s in candidate],
                                                         limits)
            assert found["cosine"] == pytest.approx(ours.cosine, abs=1e-12)
            assert found["snr_db"] == pytest.approx(ours.snr_db, abs=1e-9)
            assert found["max_abs_err"] == pytest.approx(ours.max_abs_err)
            assert (not broken) == ours.passed, (scale, limits, broken)
    nan = [{"y": np.array([[1.0, np.nan]], np.float32)}]
    assert package_check.output_metrics([np.ones((1, 2), np.float32)], [nan[0]["y"]], {})[1] == ["1 NaN/Inf values"]
    labels, flipped = np.arange(50, dtype=np.int64), np.arange(50, dtype=np.int64)
    flipped[0] = 7
    for limits in ({}, {"mismatch_max": 0.01}, {"mismatch_max": 0.02}):  # 1 of 50 differs: a share of 0.02
        ours = compare_outputs([{"label": labels}], [{"label": flipped}], Tolerance(**limits))
        assert (not package_check.output_metrics([labels], [flipped], limits)[1]) == ours.passed, limits
    image = np.arange(200, dtype=np.uint8)  # a uint8 image moved by one in one pixel of 200: values, not labels
    moved = image.copy()
    moved[5] += 1
    for limits in ({"cosine_min": 0.999}, {"cosine_min": 0.999, "integer_values": ["image"]},
                   {"cosine_min": 0.999, "integer_values": []}):
        ours = compare_outputs([{"image": image}], [{"image": moved}], Tolerance(**limits))
        assert ours.passed == bool(limits.get("integer_values")), limits
        assert (not package_check.output_metrics([image], [moved], limits, "image")[1]) == ours.passed, limits


def test_the_verdict_picks_what_is_packaged() -> None:
    report = report_with(artifacts=[{"name": "fp32"}, {"name": "int8"}],
                         validation=[{"variant": v, "target": t, "status": "passed"} for v in ("fp32", "int8")
                                     for t in ("ort:cpu", "openvino:cpu", "reference:cpu")])
    assert set(chosen_pairs(report)) == {(v, t) for v in ("fp32", "int8") for t in ("ort:cpu", "openvino:cpu")}
    report["verdict"] = {"by": "latency", "batch_size": 1, "targets": {
        "ort:cpu": {"status": "ship", "variant": "int8"}, "openvino:cpu": {"status": "none", "variant": None}}}
    assert chosen_pairs(report) == [("int8", "ort:cpu")]
    assert len(chosen_pairs(report, which="passed")) == 4  # every passed row, verdict or not


def qdeploy(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "qdeploy.cli", *args], capture_output=True, text=True,
                          timeout=300, cwd=REPO)


def test_package_command_writes_and_refuses_clearly(run_dir: Path, tmp_path: Path) -> None:
    done = qdeploy("package", str(run_dir), "--target", "openvino:cpu", "--variant", "int8", "--out",
                   str(tmp_path / "dist"))
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "dist" / "openvino-cpu-int8" / "manifest.json").is_file()
    assert without_qdeploy(tmp_path / "dist" / "openvino-cpu-int8").returncode == 0
    wrong = qdeploy("package", str(run_dir), "--target", "ort:tensorrt", "--out", str(tmp_path / "x"))
    assert wrong.returncode == 2 and "--target ort:tensorrt: the run validated ort:cpu" in wrong.stderr
    unavailable = qdeploy("package", str(run_dir), "--target", "ort:cuda", "--variant", "fp32", "--out",
                          str(tmp_path / "x"))
    assert unavailable.returncode == 2 and "did not pass validation (unavailable" in unavailable.stderr
    assert "Traceback" not in wrong.stderr + unavailable.stderr


def test_package_command_refuses_changed_artifacts(run_dir: Path, tmp_path: Path) -> None:
    copy = tmp_path / "run"
    copy.mkdir()
    shutil.copytree(run_dir / "artifacts", copy / "artifacts")
    shutil.copyfile(run_dir / "report.json", copy / "report.json")
    shutil.copytree(run_dir / "packages", copy / "packages")
    check_data = copy / "packages" / "reference-check.npz"
    check_data.write_bytes(check_data.read_bytes() + b"\0")
    done = qdeploy("package", str(copy), "--target", "ort:cpu", "--variant", "int8", "--out", str(tmp_path / "d"))
    assert done.returncode == 2 and "reference-check.npz: missing or changed since the run" in done.stderr
    model = copy / "artifacts" / "int8.onnx"
    model.write_bytes(model.read_bytes() + b"\0")
    done = qdeploy("package", str(copy), "--target", "ort:cpu", "--variant", "int8", "--out", str(tmp_path / "d"))
    assert done.returncode == 2 and "artifacts/int8.onnx changed since the run" in done.stderr
    assert not (tmp_path / "d" / "ort-cpu-int8").exists()


def test_packages_can_be_turned_off_and_their_link_goes(run_dir: Path, tmp_path: Path) -> None:
    shutil.copyfile(run_dir.parent / "tiny.onnx", tmp_path / "tiny.onnx")
    body = RECIPE.replace("report: {packages: {which: passed}}", "report: {packages: {enabled: false}}")
    out = tmp_path / "out"
    first = run_recipe(load_recipe_file(write_recipe(tmp_path, RECIPE)), RunOptions(out_dir=out, show_progress=False))
    assert (out / "packages").is_symlink() and first.report["packages"]["written"]
    second = run_recipe(load_recipe_file(write_recipe(tmp_path, body, "off.yaml")),
                        RunOptions(out_dir=out, show_progress=False))
    assert second.report["packages"] == {"enabled": False, "written": [], "failed": []}
    assert not (out / "packages").exists() and not (out / "packages").is_symlink()


def test_staging_folders_of_a_killed_package_run_are_removed_by_the_next(tmp_path: Path) -> None:
    """A killed `qdeploy package` left `.<name>.tmp-*` folders that no later run removed; one whose process still
    runs (another package run writing beside it) is left alone."""
    import subprocess

    from qdeploy.pipeline.publish.package import remove_abandoned_staging

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    abandoned = [tmp_path / f".ort-cpu-int8.tmp-{dead.pid}-x1y2", tmp_path / ".ort-cpu-int8.tmp-q8w9e0"]  # old form
    live = tmp_path / f".ort-cpu-fp32.tmp-{os.getpid()}-a1b2"
    for folder in (*abandoned, live, tmp_path / "ort-cpu-int8"):
        (folder / "check").mkdir(parents=True)
    assert sorted(remove_abandoned_staging(tmp_path)) == sorted(abandoned)
    assert live.is_dir() and (tmp_path / "ort-cpu-int8").is_dir() and not any(f.exists() for f in abandoned)


def _edited(folder: Path, edit: Any) -> dict[str, Any]:
    manifest = json.loads((folder / "manifest.json").read_text())
    edit(manifest)
    (folder / "manifest.json").write_text(json.dumps(manifest))
    return manifest


def test_a_manifest_cannot_send_the_check_outside_its_folder(run_dir: Path, tmp_path: Path) -> None:
    """check.py followed '../' names: it ran a model outside the package and printed PASS, and hashed
    /etc/hostname.  Every name must stay inside the folder, or nothing is read, hashed or run."""
    folder = copy_package(run_dir, "ort-cpu-fp32", tmp_path)
    shutil.copy(folder / "model.onnx", tmp_path / "elsewhere.onnx")

    def move_model(manifest: dict[str, Any]) -> None:
        record = manifest["files"].pop("model.onnx")
        manifest["files"]["../elsewhere.onnx"] = record
        manifest["model"]["file"] = "../elsewhere.onnx"

    (folder / "model.onnx").unlink()
    problems = package_check.verify_files(folder, _edited(folder, move_model))
    assert problems == ["'../elsewhere.onnx': not a path inside the package folder"]
    done = without_qdeploy(folder)
    assert done.returncode == 1 and "PASS" not in done.stdout.splitlines()[-1]

    manifest = _edited(folder, lambda m: m["files"].update({"/etc/hostname": {"sha256": "0", "size_bytes": 1}}))
    assert "'/etc/hostname': not a path inside the package folder" in package_check.verify_files(folder, manifest)
    (folder / "link.onnx").symlink_to(tmp_path / "elsewhere.onnx")
    manifest = _edited(folder, lambda m: m["files"].update({"link.onnx": {"sha256": "0", "size_bytes": 1}}))
    assert "link.onnx: a symbolic link, which a package never holds" in package_check.verify_files(folder, manifest)


def test_an_empty_tolerance_set_fails_the_check(run_dir: Path, tmp_path: Path) -> None:
    folder = copy_package(run_dir, "ort-cpu-fp32", tmp_path)
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["check"]["tolerances"] = {}
    del manifest["files"]
    write_manifest(folder, manifest)
    done = without_qdeploy(folder)
    assert done.returncode == 1, done.stdout
    assert "no tolerance to hold the outputs to" in done.stdout


@pytest.mark.parametrize(("edit", "words"), [
    (lambda report: report["validation"][0].update(metrics=[1, 2]), "metrics: Input should be a valid dictionary"),
    (lambda report: report.update(validation="many"), "not shaped as qdeploy writes it"),
    (lambda report: [1, 2], "a JSON list, not an object"),
])
def test_a_malformed_report_is_an_input_error_not_an_internal_one(run_dir: Path, tmp_path: Path, edit: Any,
                                                                   words: str) -> None:
    copy = Path(shutil.copytree(run_dir, tmp_path / "run", ignore=shutil.ignore_patterns("cache", "packages")))
    report = json.loads((copy / "report.json").read_text())
    edited = edit(report)
    (copy / "report.json").write_text(json.dumps(report if edited is None else edited))
    done = qdeploy("package", str(copy), "--target", "ort:cpu", "--out", str(tmp_path / "dist"))
    assert done.returncode == 2 and words in done.stderr and "internal error" not in done.stderr, done.stderr
    assert not (tmp_path / "dist").exists() or not any((tmp_path / "dist").iterdir())
