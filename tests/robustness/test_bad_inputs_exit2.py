"""Every bad input ends in exit 2 with its cause (file, field or tensor named), never "internal error".

The cases are the ones a hostile or careless user found (issue 14).  Most run the CLI in this process (fast);
the read-only file system needs a mount namespace and runs in a subprocess.
"""

from __future__ import annotations

import errno
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from tests.helpers.models import tiny_cnn
from tests.robustness.helpers import RECIPE, assert_exit_2, qdeploy, recipe_with_model


def _run(recipe: Path, *extra: str) -> tuple[int, str]:
    return qdeploy("run", str(recipe), "-q", *(extra or ("--out", str(recipe.parent / "o"))))


def _single_input_model(elem_type: int = TensorProto.FLOAT, shape: list[int] | None = None) -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", elem_type, shape or [1, 4])
    y = helper.make_tensor_value_info("y", elem_type, shape or [1, 4])
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"], name="id")], "g", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


# --- YAML -------------------------------------------------------------------------------------------------------

def test_a_python_tag_is_refused_with_its_line_and_never_runs(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    body = RECIPE.replace("name: r", f"name: !!python/object/apply:os.system ['touch {marker}']")
    recipe = recipe_with_model(tmp_path, body=body)
    assert_exit_2(qdeploy("check", str(recipe)), f"{recipe}:1", "python/object/apply", "plain values")
    assert not marker.exists()


@pytest.mark.parametrize(("text", "needle"), [
    ("a: &x [1, *x]\n", "recursive alias"),
    ("a: " + "[" * 200 + "]" * 200 + "\n", "nest more than"),
    ("a: !!int abc\n", "cannot be read"),
    ("? [1, 2]\n: x\n", "unhashable"),
])
def test_yaml_that_cannot_become_plain_data_is_exit_2(tmp_path: Path, text: str, needle: str) -> None:
    recipe = tmp_path / "r.yaml"
    recipe.write_text(text)
    assert_exit_2(qdeploy("check", str(recipe)), str(recipe), needle)


def test_shared_aliases_are_still_fine(tmp_path: Path) -> None:
    """The bound counts expanded values; ordinary anchors (a shared config) pass."""
    body = RECIPE.replace("  fp32: [simplify]", "  fp32: &chain [simplify]\n  again: *chain")
    recipe = recipe_with_model(tmp_path, body=body)
    code, stderr = qdeploy("check", str(recipe))
    assert code == 0, stderr


# --- paths the user gives ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("command", ["check", "run"])
@pytest.mark.parametrize("kind", ["symlink loop", "folder", "dangling symlink"])
def test_a_model_path_that_is_no_file_is_exit_2(tmp_path: Path, kind: str, command: str) -> None:
    recipe = recipe_with_model(tmp_path)
    model = tmp_path / "model.onnx"
    model.unlink()
    if kind == "symlink loop":
        model.symlink_to(model)
    elif kind == "folder":
        model.mkdir()
    else:
        model.symlink_to(tmp_path / "gone.onnx")
    needle = {"symlink loop": "symbolic link loop", "folder": "is a folder", "dangling symlink": "gone.onnx"}[kind]
    outcome = qdeploy("check", str(recipe)) if command == "check" else _run(recipe)
    assert_exit_2(outcome, f"{recipe}:2", "model.onnx", needle)


@pytest.mark.parametrize(("flag", "target", "needle"), [
    ("--out", "a_file", "is a file, not a folder"),
    ("--cache-dir", "a_file", "is a file, not a folder"),
    ("--out", "/proc/self/qdeploy-out", "cannot be created there"),
    ("--out", "a_file/below", "has a part that is a file"),
])
def test_output_folders_that_cannot_be_made_are_exit_2(tmp_path: Path, flag: str, target: str, needle: str) -> None:
    recipe = recipe_with_model(tmp_path)
    (tmp_path / "a_file").write_text("x")
    path = target if target.startswith("/") else str(tmp_path / target)
    extra = ("--out", str(tmp_path / "o")) if flag == "--cache-dir" else ()
    assert_exit_2(_run(recipe, flag, path, *extra), flag, path, needle)
    assert (tmp_path / "a_file").read_text() == "x"


def test_output_on_a_read_only_file_system_is_exit_2(tmp_path: Path) -> None:
    if shutil.which("unshare") is None:
        pytest.skip("no unshare(1) to mount a read-only file system")
    recipe = recipe_with_model(tmp_path)
    mount = tmp_path / "ro"
    mount.mkdir()
    script = (f"mount -t tmpfs -o ro none {mount} || exit 99; "
              f"exec {sys.executable} -m qdeploy.cli run {recipe} -q --out {mount}/out")
    result = subprocess.run(["unshare", "-rm", "sh", "-c", script], capture_output=True, text=True, timeout=120)
    if result.returncode == 99 or "unshare failed" in result.stderr:
        pytest.skip(f"cannot mount a read-only file system here: {result.stderr.strip()[:200]}")
    assert result.returncode == 2, result.stderr
    assert f"{mount}/out" in result.stderr and "read-only file system" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr


def test_an_os_error_on_a_user_path_deep_in_a_run_is_exit_2(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The one place that turns OS errors into exit 2: what the up-front checks cannot foresee still names its path."""
    import qdeploy.pipeline.run.runner

    def refused(*_args: object, **_kwargs: object) -> None:
        raise PermissionError(errno.EACCES, "Permission denied", str(tmp_path / "o" / "report.json"))

    monkeypatch.setattr(qdeploy.pipeline.run.runner, "run_recipe", refused)
    assert_exit_2(_run(recipe_with_model(tmp_path)), "report.json", "permission denied")


def test_data_symlinks_that_leave_the_folder_are_refused(tmp_path: Path) -> None:
    data = tmp_path / "calib"
    data.mkdir()
    secret = tmp_path / "secret.npy"
    np.save(secret, np.zeros((1, 3, 16, 16), np.float32))
    (data / "b.npy").symlink_to(secret)
    body = RECIPE.replace("calib: {reader: random, samples: 4}", "calib: {reader: npy, path: calib}")
    recipe = recipe_with_model(tmp_path, body=body)
    for outcome in (qdeploy("check", str(recipe)), _run(recipe)):
        assert_exit_2(outcome, "data.calib.path", "b.npy", "outside the folder")


# --- models -----------------------------------------------------------------------------------------------------

def _external_model(folder: Path, key: str, value: str) -> bytes:
    onnx.save(tiny_cnn(), folder / "model.onnx", save_as_external_data=True, location="w.bin", size_threshold=0)
    model = onnx.load(str(folder / "model.onnx"), load_external_data=False)
    entries = next(t for t in model.graph.initializer if t.name == "conv_w").external_data
    for entry in entries:
        if entry.key == key:
            entry.value = value
    return model.SerializeToString()


@pytest.mark.parametrize(("key", "value", "needle"), [
    ("length", "abc", "length 'abc' is not a whole number"),
    ("offset", "-8", "offset -8 is negative"),
    ("offset", "99999999", "which holds"),
])
def test_damaged_external_data_entries_are_exit_2(tmp_path: Path, key: str, value: str, needle: str) -> None:
    recipe = recipe_with_model(tmp_path, _external_model(tmp_path, key, value))
    for outcome in (qdeploy("check", str(recipe)), _run(recipe)):
        assert_exit_2(outcome, "model.onnx", "tensor 'conv_w'", needle)


def test_a_graph_without_outputs_is_exit_2_at_check_and_run(tmp_path: Path) -> None:
    model = tiny_cnn()
    del model.graph.output[:]
    recipe = recipe_with_model(tmp_path, model)
    for outcome in (qdeploy("check", str(recipe)), _run(recipe)):
        assert_exit_2(outcome, "model.onnx", "declares no outputs")


def test_an_input_too_large_to_sample_is_refused_with_the_estimate(tmp_path: Path) -> None:
    body = RECIPE.replace("model: {onnx: MODEL}", "model: {onnx: MODEL, inputs: [{name: x, shape: [100000, 100000]}]}")
    recipe = recipe_with_model(tmp_path, _single_input_model(), body=body)
    for outcome in (qdeploy("check", str(recipe)), _run(recipe)):
        assert_exit_2(outcome, "model.onnx", "input 'x' [100000, 100000] float32", "40.0 GB")


def test_a_string_input_is_refused_by_check(tmp_path: Path) -> None:
    recipe = recipe_with_model(tmp_path, _single_input_model(TensorProto.STRING))
    assert_exit_2(qdeploy("check", str(recipe)), "model.onnx", "input 'x' is a tensor of STRING", "tokenization")


def test_a_model_onnx_runtime_saved_with_its_cpu_layout_ops_is_refused_with_what_to_give_instead(
        tmp_path: Path) -> None:
    """A file saved at ORT_ENABLE_ALL holds com.microsoft.nchwc ops (blocked convolutions for the CPU that saved
    it): the error said no runtime knew them, and nothing about where they come from."""
    model = _single_input_model()
    model.graph.node[0].CopyFrom(helper.make_node("ReorderInput", ["x"], ["y"], name="reorder",
                                                  domain="com.microsoft.nchwc"))
    model.opset_import.append(helper.make_opsetid("com.microsoft.nchwc", 1))
    recipe = recipe_with_model(tmp_path, model)
    assert_exit_2(qdeploy("check", str(recipe)), "node 'reorder'", "com.microsoft.nchwc", "ORT_ENABLE_ALL",
                  "before ONNX Runtime optimized it")


def test_a_bfloat16_input_is_refused_with_what_to_export_instead(tmp_path: Path) -> None:
    recipe = recipe_with_model(tmp_path, _single_input_model(TensorProto.BFLOAT16))
    code, stderr = qdeploy("check", str(recipe))
    assert_exit_2((code, stderr), "input 'x' is a tensor of BFLOAT16", "export the float32 model")
    assert "tokenization" not in stderr


def test_a_negative_dimension_is_refused_by_check_unless_the_recipe_overrides_it(tmp_path: Path) -> None:
    recipe = recipe_with_model(tmp_path, _single_input_model(shape=[-5, 4]))
    assert_exit_2(qdeploy("check", str(recipe)), "model.onnx", "input 'x'", "negative dimension", "model.inputs")
    fixed = RECIPE.replace("model: {onnx: MODEL}", "model: {onnx: MODEL, inputs: [{name: x, shape: [batch, 4]}]}")
    recipe = recipe_with_model(tmp_path, _single_input_model(shape=[-5, 4]), body=fixed)
    code, stderr = qdeploy("check", str(recipe))
    assert code == 0, stderr


def test_minus_one_is_a_dynamic_dimension_and_export_names_it() -> None:
    """Paddle and older exporters write -1 for a dynamic dimension; ONNX Runtime reads it so, and so do we."""
    from qdeploy.stages.export import ExportConfig, _prepare

    findings: dict[str, object] = {}
    model = _prepare(_single_input_model(shape=[-1, 4]), ExportConfig(onnx="m.onnx"), findings, Path)
    dims = model.graph.input[0].type.tensor_type.shape.dim
    assert (dims[0].dim_param, dims[1].dim_value) == ("x_dim0", 4)
    assert findings["minus_one_dims_named"] == ["x"]


# --- data -------------------------------------------------------------------------------------------------------

def _npy_with_header(path: Path, shape: tuple[int, ...]) -> None:
    header = f"{{'descr': '<f4', 'fortran_order': False, 'shape': {shape}, }}"
    header += " " * (117 - len(header)) + "\n"
    path.write_bytes(b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header.encode() + bytes(64))


def test_an_npy_header_claiming_a_trillion_elements_is_exit_2(tmp_path: Path) -> None:
    data = tmp_path / "calib"
    data.mkdir()
    _npy_with_header(data / "a.npy", (10**6, 10**6))
    body = RECIPE.replace("calib: {reader: random, samples: 4}", "calib: {reader: npy, path: calib}").replace(
        "  fp32: [simplify]\n", "")
    recipe = recipe_with_model(tmp_path, body=body.replace("reference: fp32", "reference: exported"))
    assert_exit_2(_run(recipe), "a.npy", "claims shape [1000000, 1000000] float32", "truncated")


# --- what `check` can know from the recipe alone ----------------------------------------------------------------

@pytest.mark.parametrize(("edit", "field", "needle"), [
    (("  fp32: [simplify]", "  fp32: [simplify]\n  x: [fp16, simplify, fp16]"), "variants.x.2",
     "stage 'fp16' appears twice"),
    (("  int8: [simplify, {quantize: {calibration: {data: calib}}}]",
      "  int8: [{quantize: {calibration: {data: calib}}}, {quantize: {calibration: {data: calib}}}]"),
     "variants.int8.1", "stage 'quantize' appears twice"),
    (("benchmark: {enabled: false}", "benchmark: {enabled: false}\ngates:\n"
      "  - {variant: fp32, target: ort:cpu, metric: cosine, min: 0.99, max: 0.5}"), "gates.0", "min 0.99 is above max"),
    (("benchmark: {enabled: false}", "benchmark: {enabled: false}\ngates:\n"
      "  - {variant: fp32, target: ort:cpu, metric: cosine, min: .nan}"), "gates.0", "not NaN"),
    (("benchmark: {enabled: false}", "benchmark: {enabled: false}\ngates:\n"
      "  - {variant: fp32, target: ort:cpu, metric: latency_ms, max: 5, batch_size: 100000000}"),
     "gates.0.batch_size", "less than or equal"),
    (("samples: 4}", "samples: 4, seed: -1}"), "data.calib.seed", "greater than or equal to 0"),
    (("samples: 4}", "samples: 1000000000}"), "data.calib.samples", "less than or equal"),
    (("model: {onnx: model.onnx}", "model: {onnx: model.onnx, inputs: [{name: input, shape: [1, 3, 4294967296, 2]}]}"),
     "model.inputs.0.shape", "at most 2147483647"),
    (("model: {onnx: model.onnx}", "model: {onnx: model.onnx, inputs: [{name: input, low: 5, high: 1}]}"),
     "model.inputs.0", "low 5.0 is above high 1.0"),
    (("model: {onnx: model.onnx}", "model: {onnx: model.onnx, inputs: [{name: input, high: .inf}]}"),
     "model.inputs.0", "finite"),
])
def test_recipe_fields_out_of_bounds_fail_check(tmp_path: Path, edit: tuple[str, str], field: str,
                                                needle: str) -> None:
    recipe = recipe_with_model(tmp_path)
    text = recipe.read_text()
    assert edit[0] in text
    recipe.write_text(text.replace(*edit))
    assert_exit_2(qdeploy("check", str(recipe)), f"field '{field}'", needle)


def test_samples_larger_than_memory_allows_are_refused_before_they_are_read(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import qdeploy.calibration.readers as readers
    from qdeploy.core.errors import DataError

    monkeypatch.setattr(readers, "sample_memory_cap", lambda: 10_000)
    info = [readers.InputInfo("input", (1, 3, 64, 64), np.dtype(np.float32))]  # 48 KB a sample
    np.savez_compressed(tmp_path / "a.npz", input=np.zeros((1, 3, 64, 64), np.float32))
    with pytest.raises(DataError, match=r"a\.npz: 'input\.npy' is \[1, 3, 64, 64\] float32 \(49\.2 KB\), more than"):
        list(readers.npy_samples(tmp_path, info))
    with pytest.raises(DataError, match=r"random data: one sample takes 49\.2 KB"):
        next(readers.random_samples(info, 1))


def test_an_image_bomb_is_a_data_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from PIL import Image

    from qdeploy.calibration.images import image_samples
    from qdeploy.calibration.readers import InputInfo
    from qdeploy.core.errors import DataError
    from qdeploy.pipeline.recipe.schema import DatasetSpec

    Image.new("RGB", (64, 64)).save(tmp_path / "a.png")
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)  # Pillow refuses images over twice this many pixels
    info = [InputInfo("input", (1, 3, 16, 16), np.dtype(np.float32))]
    with pytest.raises(DataError, match=r"a\.png: cannot read image: .*decompression bomb"):
        list(image_samples(tmp_path, info, DatasetSpec(reader="images", path=".")))
