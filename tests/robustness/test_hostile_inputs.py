"""Hostile inputs of issue 40: each ends in exit 2 naming the file, field or tensor and the cause (or, for a path
the file system allows, in a report), never in "internal error" or a traceback."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.helpers.frozen import write_rate_if_model
from tests.helpers.models import tiny_cnn, write_recipe
from tests.robustness.helpers import assert_exit_2, qdeploy

FROZEN = """
name: r
model:
  onnx: rate_if.onnx
  inputs: [{name: sr, value: VALUE}, {name: audio, shape: [1, 1, 16]}]
variants:
  fp32: [simplify]
targets: [ort:cpu]
validate: {reference: fp32, samples: 2}
benchmark: {enabled: false}
report: {layers: "off", packages: {enabled: false}}
"""


def _npy_claiming(path: Path, shape: tuple[int, ...], descr: str = "<i8") -> None:
    """A .npy of a few bytes whose header claims ``shape``."""
    header = f"{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape}, }}"
    header += " " * (117 - len(header)) + "\n"
    path.write_bytes(b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header.encode() + bytes(64))


def _frozen_recipe(folder: Path, value: str) -> Path:
    write_rate_if_model(folder)
    return write_recipe(folder, FROZEN.replace("VALUE", value))


# --- .npy files: one checked loader -----------------------------------------------------------------------------

def test_a_frozen_value_whose_header_claims_a_trillion_elements_is_exit_2(tmp_path: Path) -> None:
    _npy_claiming(tmp_path / "sr.npy", (10**6, 10**6))
    recipe = _frozen_recipe(tmp_path, "sr.npy")
    for outcome in (qdeploy("check", str(recipe)), qdeploy("run", str(recipe), "-q", "--out", str(tmp_path / "o"))):
        assert_exit_2(outcome, "model.inputs 'sr'", "sr.npy", "claims shape [1000000, 1000000] int64", "truncated")


@pytest.mark.parametrize("how", ["object array", "plain pickle"])
def test_a_pickled_frozen_value_is_exit_2_and_never_suggests_unpickling(tmp_path: Path, how: str) -> None:
    if how == "object array":
        np.save(tmp_path / "sr.npy", np.array([{"rate": 16000}], dtype=object), allow_pickle=True)
    else:
        (tmp_path / "sr.npy").write_bytes(pickle.dumps(np.array(16000)))
    recipe = _frozen_recipe(tmp_path, "sr.npy")
    code, stderr = qdeploy("check", str(recipe))
    assert_exit_2((code, stderr), "model.inputs 'sr'", "sr.npy")
    assert "allow_pickle" not in stderr and "pickle.load" not in stderr, stderr
    assert ("Python objects (a pickle)" if how == "object array" else "not a .npy array") in stderr, stderr


FP32_ONLY = """
    name: r
    model: {onnx: model.onnx}
    variants:
      fp32: [simplify]
    targets: [ort:cpu]
    validate: {reference: fp32, samples: 2}
    benchmark: {enabled: false}
    report: {layers: "off", packages: {enabled: false}}
    """
"""One fp32 variant on ort:cpu, nothing timed or packaged: the recipe of the tests that need only a run."""


# --- paths whose names are not UTF-8 ------------------------------------------------------------------------------

def test_a_recipe_folder_named_in_bytes_that_are_not_utf8_gets_its_report(tmp_path: Path) -> None:
    """LC_ALL=C: Python decodes such a name with surrogate escapes, which no UTF-8 file may hold as they are."""
    folder = Path(os.fsdecode(os.fsencode(tmp_path) + b"/r\xff\xfe"))
    folder.mkdir()
    onnx.save(tiny_cnn(), folder / "model.onnx")
    recipe = write_recipe(folder, FP32_ONLY)
    code, stderr = qdeploy("run", str(recipe), "-q", "--out", str(tmp_path / "o"))
    assert code == 0, stderr
    markdown, html = ((tmp_path / "o" / name).read_bytes().decode("utf-8") for name in ("report.md", "report.html"))
    assert "qdeploy report" in markdown and "r\\xff\\xfe" in html  # the recipe's path, as `ls -b` shows it
    assert json.loads((tmp_path / "o" / "report.json").read_text())["recipe"]["path"] == str(recipe)


def test_a_strict_terminal_prints_an_output_folder_named_in_such_bytes(tmp_path: Path) -> None:
    """Where the locale's stdout is strict (en_US.UTF-8; here PYTHONIOENCODING), the summary named the report's
    folder and failed with "internal error UnicodeEncodeError" after the whole run: it prints the name's bytes."""
    onnx.save(tiny_cnn(), tmp_path / "model.onnx")
    recipe = write_recipe(tmp_path, FP32_ONLY)
    out = os.fsencode(tmp_path) + b"/o\xff"
    done = subprocess.run([sys.executable, "-m", "qdeploy", "run", str(recipe), "--out", os.fsdecode(out),
                           "--cache-dir", str(tmp_path / "cache")], capture_output=True, timeout=300,
                          env={**os.environ, "PYTHONIOENCODING": "utf-8:strict"})
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-2000:]
    assert out + b"/report.html" in done.stdout


# --- contradictions `check` refuses at recipe load ---------------------------------------------------------------

def _matmul_model(reduction: int = 64) -> onnx.ModelProto:
    weight = numpy_helper.from_array(np.random.default_rng(0).standard_normal((reduction, 32)).astype(np.float32), "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, reduction])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 32])], [weight])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


@pytest.mark.parametrize(("step", "field", "needles"), [
    ("{quantize: {per_runtime: true, runtime: openvino}}", "variants.int8.1.quantize",
     ("per_runtime: true builds one graph for each runtime", "runtime: openvino", "contradict")),
])
def test_settings_a_run_would_fail_on_are_refused_by_check(tmp_path: Path, step: str, field: str,
                                                           needles: tuple[str, ...]) -> None:
    onnx.save(_matmul_model(), tmp_path / "model.onnx")
    recipe = write_recipe(tmp_path, f"""
        name: r
        model: {{onnx: model.onnx}}
        variants:
          fp32: [simplify]
          int8: [simplify, {step}]
        targets: [ort:cpu, openvino:cpu]
        """)
    assert_exit_2(qdeploy("check", str(recipe)), f"{recipe}:5", f"field '{field}'", *needles)
