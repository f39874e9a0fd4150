"""`qdeploy check` refuses what `qdeploy run` would refuse, with the same cause, and runs nothing (issue 28).

Each case was found passing `check` and failing `run` (or crashing it): graphs onnx's plain checker accepts and ONNX
Runtime does not load, a misspelt torch factory, samples of the wrong shape or dtype, the file checks a sweep's
matrix skipped, and a cache deleted while validation ran.
"""

from __future__ import annotations

import os
import shutil
import textwrap
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from typer.testing import CliRunner

from qdeploy.cli import app
from qdeploy.core.errors import ModelError, RecipeError
from tests.helpers.models import tiny_cnn, write_recipe
from tests.robustness.helpers import RECIPE, assert_exit_2, qdeploy, recipe_with_model

# --- graphs onnx's plain checker passes and ONNX Runtime refuses -------------------------------------------------

def _float16_input() -> onnx.ModelProto:
    model = tiny_cnn()
    model.graph.input[0].type.tensor_type.elem_type = TensorProto.FLOAT16  # into a Conv of float weights
    return model


def _int64_output() -> onnx.ModelProto:
    model = tiny_cnn()
    model.graph.output[0].type.tensor_type.elem_type = TensorProto.INT64  # Gemm makes float
    return model


def _rewired_conv() -> onnx.ModelProto:
    model = tiny_cnn()
    model.graph.node[0].input[1] = "fc_w"  # the Conv's weight is now the rank-2 Gemm weight
    return model


INVALID_GRAPHS = {
    "float16 input into float weights": (_float16_input, ("node 'conv' (Conv)", "'input' float16", "'conv_w' float")),
    "output declared int64": (_int64_output, ("node 'fc' (Gemm)", "makes 'logits' float", "declares 'logits' int64")),
    "rewired Conv input": (_rewired_conv, ("node 'conv' (Conv)", "weight tensor")),
}


@pytest.mark.parametrize("command", ["check", "run"])
@pytest.mark.parametrize("case", sorted(INVALID_GRAPHS))
def test_a_graph_onnx_runtime_refuses_is_exit_2_in_check_and_run(tmp_path: Path, case: str, command: str) -> None:
    make, needles = INVALID_GRAPHS[case]
    model = make()
    onnx.checker.check_model(model)  # what the old check relied on: it passes
    recipe = recipe_with_model(tmp_path, model)
    extra = ("-q", "--out", str(tmp_path / "o")) if command == "run" else ()
    assert_exit_2(qdeploy(command, str(recipe), *extra), "model model.onnx", "not a valid ONNX graph", *needles)


def test_an_inference_complaint_onnx_runtime_does_not_share_is_only_a_warning(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """onnx's strict inference is stricter than the runtime on some exporters' graphs: ORT decides."""
    from qdeploy.stages.export import _inference

    _inference.check_inferred_types(tiny_cnn())  # a valid graph: nothing to say
    with pytest.raises(ModelError, match="ONNX Runtime refuses it too"):
        _inference.check_inferred_types(_int64_output())
    monkeypatch.setattr(_inference, "_runtime_refusal", lambda model: None)  # as if ORT loaded it
    warned: list[str] = []
    monkeypatch.setattr(_inference.log, "warning", lambda text, *args: warned.append(text % args))
    _inference.check_inferred_types(_int64_output())
    assert len(warned) == 1 and "ONNX Runtime loads the model; not refused" in warned[0], warned


def test_ops_onnx_has_no_schema_for_are_not_refused_by_inference(tmp_path: Path) -> None:
    """A com.microsoft op feeding a Conv: onnx's inference cannot type it, ONNX Runtime runs it."""
    weight = numpy_helper.from_array(np.ones((4, 3, 3, 3), np.float32), "w")
    nodes = [helper.make_node("Gelu", ["x"], ["g"], domain="com.microsoft", name="gelu"),
             helper.make_node("Conv", ["g", "w"], ["y"], name="conv")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 6, 6])], [weight])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 8
    recipe = recipe_with_model(tmp_path, model, body=RECIPE.replace(
        "  int8: [simplify, {quantize: {calibration: {data: calib}}}]\n", ""))
    code, stderr = qdeploy("check", str(recipe))
    assert code == 0, stderr


def test_a_stale_intermediate_shape_is_not_refused(tmp_path: Path) -> None:
    """Exporters leave value_info ONNX Runtime ignores (merges leniently): strict inference must not judge it."""
    model = tiny_cnn()
    model.graph.value_info.append(helper.make_tensor_value_info("relu", TensorProto.FLOAT, [1, 8, 99, 99]))
    code, stderr = qdeploy("check", str(recipe_with_model(tmp_path, model)))
    assert code == 0, stderr


def test_a_model_with_external_data_gets_the_type_check_too(tmp_path: Path) -> None:
    """`check` reads no external data (the checker needs it in memory): strict inference still runs."""
    model = _float16_input()
    onnx.save(model, tmp_path / "model.onnx", save_as_external_data=True, all_tensors_to_one_file=True,
              location="model.data", size_threshold=0)
    recipe = write_recipe(tmp_path, RECIPE.replace("MODEL", "model.onnx"))
    assert_exit_2(qdeploy("check", str(recipe)), "model model.onnx", "node 'conv' (Conv)")
    onnx.save(tiny_cnn(), tmp_path / "model.onnx", save_as_external_data=True, all_tensors_to_one_file=True,
              location="model.data", size_threshold=0)
    code, stderr = qdeploy("check", str(recipe))
    assert code == 0, stderr


# --- the torch factory, found without running it ------------------------------------------------------------------

NET = """
    import math

    def build():
        return math.pi
"""
TORCH_RECIPE = """
name: t
model:
  torch: {factory: 'FACTORY'}
  inputs: [{name: x, shape: [1, 4]}]
variants:
  fp32: []
targets: [ort:cpu]
benchmark: {enabled: false}
"""


@pytest.mark.parametrize("command", ["check", "run"])
def test_a_misspelt_factory_is_exit_2_with_the_recipe_line_in_check_and_run(tmp_path: Path, command: str) -> None:
    (tmp_path / "net.py").write_text(textwrap.dedent(NET))
    recipe = write_recipe(tmp_path, TORCH_RECIPE.replace("FACTORY", "net.py:bulid"))
    extra = ("-q", "--out", str(tmp_path / "o")) if command == "run" else ()
    assert_exit_2(qdeploy(command, str(recipe), *extra), f"{recipe}:3", "model.torch.factory",
                  str(tmp_path / "net.py"), "no 'bulid'", "did you mean 'build'")


def test_a_factory_file_that_does_not_parse_names_its_line(tmp_path: Path) -> None:
    (tmp_path / "net.py").write_text("import math\n\ndef build(:\n    pass\n")
    recipe = write_recipe(tmp_path, TORCH_RECIPE.replace("FACTORY", "net.py:build"))
    assert_exit_2(qdeploy("check", str(recipe)), f"{recipe}:3", f"{tmp_path / 'net.py'}:3", "cannot be parsed")


def test_a_factory_module_is_found_without_importing_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from qdeploy.stages.export import check_factory

    package = tmp_path / "qdeploy_probe_pkg"
    package.mkdir()
    (package / "__init__.py").write_text("raise SystemExit('imported')\n")  # importing it would end the test
    (package / "nets.py").write_text("raise SystemExit('imported')\n\ndef build():\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    check_factory("qdeploy_probe_pkg.nets:build", Path)
    with pytest.raises(RecipeError, match=r"defines no 'biuld'.*did you mean 'build'"):
        check_factory("qdeploy_probe_pkg.nets:biuld", Path)
    with pytest.raises(RecipeError, match="module 'qdeploy_no_such_module' cannot be found"):
        check_factory("qdeploy_no_such_module.nets:build", Path)
    with pytest.raises(RecipeError, match=r"module 'qdeploy_probe_pkg\.nest' cannot be found"):
        check_factory("qdeploy_probe_pkg.nest:build", Path)
    # found through every finder of sys.meta_path, as import finds it (an editable install maps its own folders)
    with pytest.raises(RecipeError, match=r"no 'load_recpe_file'.*did you mean 'load_recipe_file'"):
        check_factory("qdeploy.pipeline.recipe.loader:load_recpe_file", Path)


@pytest.mark.parametrize(("source", "name"), [
    ("from torchvision.models import *\n", "resnet18"),  # names no parser can list: given the benefit of the doubt
    ("def __getattr__(name):\n    return name\n", "anything"),
    ("try:\n    from fast import build\nexcept ImportError:\n    def build():\n        pass\n", "build"),
    ("if True:\n    Net = object\n", "Net"),
    ("class Net:\n    pass\n", "Net"),
    ("from .nets import make as build\n", "build"),
    ("build: object = None\n", "build"),
])
def test_names_a_module_may_define_are_accepted(tmp_path: Path, source: str, name: str) -> None:
    from qdeploy.stages.export import check_factory

    (tmp_path / "net.py").write_text(source)
    check_factory(f"net.py:{name}", lambda relative: tmp_path / relative)


# --- samples against the model's inputs, from their headers -------------------------------------------------------

NPY_RECIPE = RECIPE.replace("{reader: random, samples: 4}", "{reader: npy, path: samples}")


def _samples(folder: Path, arrays: dict[str, np.ndarray | dict[str, np.ndarray]]) -> Path:
    samples = folder / "samples"
    samples.mkdir()
    for name, array in arrays.items():
        if isinstance(array, dict):
            np.savez(samples / f"{name}.npz", **array)
        else:
            np.save(samples / f"{name}.npy", array)
    return samples


GOOD = np.zeros((1, 3, 16, 16), np.float32)


@pytest.mark.parametrize(("bad", "needles"), [
    (np.zeros((1, 3, 8, 8), np.float32), ("has shape [1, 3, 8, 8]", "expects [1, 3, 16, 16]")),
    (np.zeros((1, 3, 16, 16), np.int64), ("is int64", "expects float32")),
    (np.zeros((2, 3, 16, 16, 1), np.float32), ("has shape [2, 3, 16, 16, 1]",)),
    ({"wrong_name": GOOD}, ("no array for model input 'input'", "['wrong_name']")),
])
def test_samples_that_do_not_fit_the_inputs_are_exit_2_in_check(tmp_path: Path, bad: object,
                                                                  needles: tuple[str, ...]) -> None:
    _samples(tmp_path, {"a": GOOD, "b": bad})  # type: ignore[dict-item]
    recipe = recipe_with_model(tmp_path, body=NPY_RECIPE)
    suffix = "npz" if isinstance(bad, dict) else "npy"
    assert_exit_2(qdeploy("check", str(recipe)), "dataset 'calib'", str(tmp_path / "samples" / f"b.{suffix}"),
                  "input 'input'" if suffix == "npy" else "input", *needles)


def test_samples_that_fit_pass_check_without_their_batch_dimension(tmp_path: Path) -> None:
    _samples(tmp_path, {"a": GOOD, "b": GOOD[0].astype(np.float64), "c": {"input": GOOD}})
    code, stderr = qdeploy("check", str(recipe_with_model(tmp_path, body=NPY_RECIPE)))
    assert code == 0, stderr


def test_check_reads_headers_not_the_samples(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Fast on large samples: np.load is never called (a header is a few hundred bytes)."""
    _samples(tmp_path, {"a": GOOD, "b": np.zeros((1, 3, 8, 8), np.float32)})
    recipe = recipe_with_model(tmp_path, body=NPY_RECIPE)

    def no_load(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("check loaded a whole sample")

    monkeypatch.setattr(np, "load", no_load)
    assert_exit_2(qdeploy("check", str(recipe)), "b.npy", "has shape [1, 3, 8, 8]")


def test_a_dataset_no_stage_reads_is_not_checked(tmp_path: Path) -> None:
    """A sweep's shared data may hold another model's samples: only the datasets the run reads must fit."""
    _samples(tmp_path, {"a": np.zeros((1, 3, 8, 8), np.float32)})
    body = RECIPE.replace("  calib: {reader: random, samples: 4}", "  calib: {reader: random, samples: 4}\n"
                          "  other: {reader: npy, path: samples}")
    code, stderr = qdeploy("check", str(recipe_with_model(tmp_path, body=body)))
    assert code == 0, stderr


def test_images_for_a_model_of_other_channels_are_exit_2_in_check(tmp_path: Path) -> None:
    folder = tmp_path / "images"
    folder.mkdir()
    (folder / "a.png").write_bytes(b"not read by check")
    body = RECIPE.replace("{reader: random, samples: 4}", "{reader: images, path: images, color: GRAY}")
    assert_exit_2(qdeploy("check", str(recipe_with_model(tmp_path, body=body))), "dataset 'calib'",
                  "3 channels", "color GRAY")


# --- a sweep's matrix gets the file checks of a recipe file ------------------------------------------------------

SWEEP = """
sweep: s
matrix:
  models:
    - {name: m, model: {onnx: MODEL}, data: {calib: {reader: npy, path: DATA}}}
  variant_sets:
    p: {fp32: [simplify], int8: [simplify, {quantize: {calibration: {data: calib}}}]}
  targets: {cpu: [ort:cpu]}
  recipe: {validate: {reference: fp32, samples: 2}, benchmark: {enabled: false}}
"""


def _sweep(folder: Path, model: str = "model.onnx", data: str = "samples") -> Path:
    onnx.save(tiny_cnn(), folder / "model.onnx")
    if not (folder / "samples").exists():
        _samples(folder, {"a": GOOD})
    return write_recipe(folder, SWEEP.replace("MODEL", model).replace("DATA", data), "sweep.yaml")


@pytest.mark.parametrize(("kind", "needles"), [
    ("/dev/zero", ("model.onnx", "is a device")),
    ("fifo", ("model.onnx", "named pipe")),
    ("symlink to /etc/passwd", ("data.calib.path", "/etc/passwd", "outside the folder")),
    ("invalid graph", ("node 'conv' (Conv)", "float16")),
    ("samples of another shape", ("b.npy", "has shape [1, 3, 8, 8]")),
])
def test_check_of_a_sweep_refuses_what_its_run_would(tmp_path: Path, kind: str, needles: tuple[str, ...]) -> None:
    sweep = _sweep(tmp_path)
    if kind == "/dev/zero":
        sweep.write_text(sweep.read_text().replace("onnx: model.onnx", "onnx: /dev/zero"))
    elif kind == "fifo":
        (tmp_path / "model.onnx").unlink()
        os.mkfifo(tmp_path / "model.onnx")
    elif kind == "symlink to /etc/passwd":
        (tmp_path / "samples" / "b.npy").symlink_to("/etc/passwd")
    elif kind == "invalid graph":
        onnx.save(_float16_input(), tmp_path / "model.onnx")
    else:
        np.save(tmp_path / "samples" / "b.npy", np.zeros((1, 3, 8, 8), np.float32))
    result = CliRunner().invoke(app, ["check", str(sweep)])
    assert result.exit_code == 2, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert "internal error" not in result.output and "Traceback" not in result.output, result.output
    assert "0 valid, 1 invalid" in result.stdout, result.stdout
    for needle in needles:
        assert needle in result.stdout, (needle, result.stdout)


def test_check_of_a_valid_sweep_still_passes(tmp_path: Path) -> None:
    code, stderr = qdeploy("check", str(_sweep(tmp_path)))
    assert code == 0, stderr


# --- a cache deleted while validation runs -----------------------------------------------------------------------

def test_a_cache_deleted_during_validation_is_exit_2_with_its_cause(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    import qdeploy.stages.validate as validate

    recipe = recipe_with_model(tmp_path)
    cache = tmp_path / "o" / "cache"
    original = validate._run_model
    calls: list[Path] = []

    def delete_after_the_reference(target: str, path: Path, *args: object, **kwargs: object) -> object:
        result = original(target, path, *args, **kwargs)
        calls.append(path)
        if len(calls) == 1:
            shutil.rmtree(cache)  # what a cleanup job or a second run's `rm -rf` does
        return result

    monkeypatch.setattr(validate, "_run_model", delete_after_the_reference)
    assert_exit_2(qdeploy("run", str(recipe), "-q", "--out", str(tmp_path / "o")), str(cache),
                  "was deleted while the run used it", "run again")


def test_a_cache_deleted_before_validation_is_exit_2_with_its_cause(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    import qdeploy.stages.validate as validate

    recipe = recipe_with_model(tmp_path)
    original = validate.run

    def delete_first(*args: object, **kwargs: object) -> object:
        shutil.rmtree(tmp_path / "o" / "cache")
        return original(*args, **kwargs)

    monkeypatch.setattr(validate, "run", delete_first)
    assert_exit_2(qdeploy("run", str(recipe), "-q", "--out", str(tmp_path / "o")), "was deleted while the run used it")


# --- doctor ------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("args", [["--bogus"], ["extra"], ["--json=yes"]])
def test_doctor_with_bad_arguments_is_exit_2(args: list[str]) -> None:
    result = CliRunner().invoke(app, ["doctor", *args])
    assert result.exit_code == 2, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
def test_doctor_onto_a_full_device_is_a_clean_error() -> None:
    import subprocess
    import sys

    with open("/dev/full", "w") as full:
        done = subprocess.run([sys.executable, "-m", "qdeploy.cli", "doctor"], stdout=full,
                              stderr=subprocess.PIPE, text=True, timeout=120)
    assert done.returncode == 1 and "no space left" in done.stderr and "Traceback" not in done.stderr, done.stderr
