"""The publishing guard loads every artifact on each runtime the recipe targets, not on ONNX Runtime alone: an
artifact OpenVINO cannot read is refused, naming the runtime and the node (``pipeline/run/guard_runtimes.py``)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from qdeploy.core.context import Artifact, StageResult
from qdeploy.core.errors import StageError
from qdeploy.pipeline.recipe.schema import Recipe
from qdeploy.pipeline.run.guard import guard_artifact
from qdeploy.pipeline.run.guard_runtimes import check_other_runtimes
from qdeploy.stages.quantize import QuantizeConfig
from qdeploy.stages.quantize.weight_only import _blocks as weight_blocks
from qdeploy.stages.quantize.weight_only._build import quantize_file
from tests.control_flow_models import pass_through_loop_model

WIDTH = 96
"""An embedding width that blocks of 128 do not divide."""

pytest.importorskip("openvino")


def _embedding(tmp_path: Path) -> Artifact:
    table = np.random.default_rng(0).standard_normal((40, WIDTH)).astype(np.float32)
    graph = helper.make_graph([helper.make_node("Gather", ["table", "ids"], ["h"], name="embed")], "g",
                              [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, 5])],
                              [helper.make_tensor_value_info("h", TensorProto.FLOAT, [1, 5, WIDTH])],
                              [numpy_helper.from_array(table, "table")])
    path = tmp_path / "float.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return Artifact(path=path, sidecar=tmp_path / "float.json", key="k", sha256="", size_bytes=path.stat().st_size,
                    stages=("export",), parent=None)


def _int4(parent: Artifact, tmp_path: Path) -> StageResult:
    output = tmp_path / "wo.onnx"
    quantize_file(parent.path, output, QuantizeConfig(mode="weight_only", group_size=128))
    return StageResult(model=onnx.load(str(output)), changed=True)


def _context(tmp_path: Path, targets: tuple[str, ...]) -> object:
    recipe = Recipe(name="t", model={"onnx": "m.onnx"}, variants={"int4": []})
    return dataclasses.replace(recipe.stage_context("int4", tmp_path / "work"), targets=targets)


def test_an_artifact_openvino_cannot_read_is_refused_naming_the_runtime_and_the_node(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Blocks of 128 over a 96-wide table (the block choice put back to group_size): ONNX Runtime pads and runs
    it, OpenVINO refuses it; with an openvino target the guard refuses to publish it."""
    monkeypatch.setattr(weight_blocks, "dividing_block", lambda length, wanted, largest=None: wanted)
    parent = _embedding(tmp_path)
    result = _int4(parent, tmp_path)
    assert guard_artifact(parent, result, "quantize", _context(tmp_path, ("ort:cpu",)))["checked"]  # ORT loads it
    with pytest.raises(StageError) as refused:
        guard_artifact(parent, result, "quantize", _context(tmp_path, ("ort:cpu", "openvino:cpu")))
    message = str(refused.value)
    assert "does not load in OpenVINO" in message and "openvino:cpu" in message
    assert "node 'embed_Q' (GatherBlockQuantized)" in message
    assert "quantize dimension (96) must be a multiple of block_size (128)" in message
    assert "not published" in message


def test_the_same_table_in_blocks_that_divide_it_passes_on_openvino(tmp_path: Path) -> None:
    parent = _embedding(tmp_path)
    verdict = guard_artifact(parent, _int4(parent, tmp_path), "quantize",
                             _context(tmp_path, ("ort:cpu", "openvino:cpu")))
    assert verdict["other_runtimes"] == {"openvino": "read and compiled by OpenVINO on CPU"}


def test_the_guard_reads_a_model_as_the_openvino_targets_read_it(tmp_path: Path) -> None:
    """A Loop returning carried values unchanged: OpenVINO's frontend refuses the file as it is, its targets read it
    through the rewrite; the guard must judge what the targets will run, not report it unchecked."""
    path = tmp_path / "loop.onnx"
    onnx.save(pass_through_loop_model(), path)
    found = check_other_runtimes(path, path, ["ort:cpu", "openvino:cpu"], "simplify", "fp32")
    assert found == {"openvino": "read and compiled by OpenVINO on CPU"}, found


def test_an_artifact_openvino_crashes_on_is_refused_and_the_run_lives(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """OpenVINO's CPU plugin has ended the process compiling some graphs (a segmentation fault): the guard compiles
    in a child process, so the artifact is refused with the reason while its input model, which compiles, passes."""
    from qdeploy.targets import openvino_probe
    from tests.helpers.fresh import crashing_on

    monkeypatch.setattr(openvino_probe, "call_isolated", crashing_on("candidate.onnx", "openvino"))
    parent = _embedding(tmp_path)
    candidate = tmp_path / "candidate.onnx"
    candidate.write_bytes(parent.path.read_bytes())
    with pytest.raises(StageError, match=r"does not load in OpenVINO.*crashed reading or compiling it.*signal 11"):
        check_other_runtimes(parent.path, candidate, ["openvino:cpu"], "quantize", "int8")
    crashed_parent = check_other_runtimes(candidate, candidate, ["openvino:cpu"], "quantize", "int8")
    assert crashed_parent["openvino"].startswith("not checked: the input model does not load in OpenVINO either")


def test_a_variant_built_for_onnx_runtime_is_loaded_only_where_it_runs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """per_runtime's ``int4@ort`` meets ONNX Runtime's targets only: before, OpenVINO's compile failing on it (its
    LPT on caustic-nmr's int8@ort graph) refused the artifact that ort:cpu would have shipped."""
    monkeypatch.setattr(weight_blocks, "dividing_block", lambda length, wanted, largest=None: wanted)
    parent = _embedding(tmp_path)
    result = _int4(parent, tmp_path)
    both = ("ort:cpu", "openvino:cpu")
    ort_build = dataclasses.replace(_context(tmp_path, both), variant="int4@ort")
    verdict = guard_artifact(parent, result, "quantize", ort_build)
    assert verdict["checked"] and "other_runtimes" not in verdict
    with pytest.raises(StageError, match="does not load in OpenVINO"):  # the OpenVINO build is still checked there
        guard_artifact(parent, result, "quantize", dataclasses.replace(ort_build, variant="int4@openvino"))
