"""OpenVINO reads models its ONNX frontend refuses as written: a Loop whose body returns loop-carried values
unchanged (Paddle2ONNX's decoders), an If on a [1, 1] condition (PyTorch's ``if score >= t``) are read through a
rewritten copy, on every path that hands OpenVINO an artifact, and what ran says so."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from qdeploy.graph.loop_carried import isolate_pass_through
from qdeploy.pipeline.publish.package import write_openvino
from qdeploy.stages import validate
from qdeploy.stages.validate import ValidateConfig
from qdeploy.targets import get_target
from qdeploy.targets.layer_profile import profile_layers
from qdeploy.targets.openvino import _ov_core
from qdeploy.targets.openvino_read import read_onnx
from qdeploy.targets.pool import open_pool
from tests.control_flow_models import matrix_condition_if_model, pass_through_loop_model
from tests.helpers.simplify import simplify_model
from tests.helpers.validate import artifact, by_pair, context

X = np.random.default_rng(0).standard_normal((1, 4)).astype(np.float32)


def _saved(model: onnx.ModelProto, path: Path, *, external: bool = False) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, path, save_as_external_data=external, location=f"{path.name}.data", size_threshold=0)
    return path


def _ort(path: Path) -> np.ndarray:
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": X})[0]


def _validates_on_openvino(path: Path) -> list[str]:
    """The model's output on openvino:cpu (f32) against ONNX Runtime within 1e-5; the notes of what ran."""
    with get_target("openvino:cpu").load(path, pin_f32=True) as session:
        got = session.run({"x": X})
        notes = session.executed.notes
    np.testing.assert_allclose(got[session.output_names[0]], _ort(path), atol=1e-5, rtol=0)
    return notes


def test_openvino_refuses_the_loop_as_written(tmp_path: Path) -> None:
    """The premise (OpenVINO 2026.4): its ONNX frontend cannot read the file itself."""
    path = _saved(pass_through_loop_model(), tmp_path / "loop.onnx")
    with pytest.raises(Exception, match="loop"):
        _ov_core().read_model(str(path))


@pytest.mark.parametrize(("nested", "external"), [(False, False), (True, False), (False, True)])
def test_a_loop_returning_carried_values_unchanged_validates_on_openvino(tmp_path: Path, nested: bool,
                                                                         external: bool) -> None:
    """Before: 'OpenVINO cannot read the model: ... loop.cpp ... loop carried dependencies'."""
    path = _saved(pass_through_loop_model(nested=nested), tmp_path / "loop.onnx", external=external)
    stored, files = path.read_bytes(), sorted(tmp_path.iterdir())
    notes = _validates_on_openvino(path)
    assert any("Identity between" in note and "Loop" in note and "w_in" in note for note in notes)
    assert path.read_bytes() == stored and sorted(tmp_path.iterdir()) == files  # untouched, nothing left beside


def test_openvino_refuses_an_if_on_a_matrix_condition_as_written(tmp_path: Path) -> None:
    path = _saved(matrix_condition_if_model(), tmp_path / "if.onnx")
    with pytest.raises(Exception, match="Rank of If condition"):
        _ov_core().read_model(str(path))


@pytest.mark.parametrize(("nested", "external"), [(False, False), (True, False), (False, True)])
def test_an_if_on_a_matrix_condition_validates_on_openvino(tmp_path: Path, nested: bool, external: bool) -> None:
    """Before: 'OpenVINO cannot read the model: ... Rank of If condition input must be equal to 0 or 1'; both
    branches are taken (the sum of x is negative for -x)."""
    path = _saved(matrix_condition_if_model(nested=nested), tmp_path / "if.onnx", external=external)
    stored, files = path.read_bytes(), sorted(tmp_path.iterdir())
    for x in (X, -X):
        with get_target("openvino:cpu").load(path, pin_f32=True) as session:
            got = session.run({"x": x})
            notes = session.executed.notes
        expected = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
        np.testing.assert_allclose(got[session.output_names[0]], expected, atol=1e-6, rtol=0)
    assert any("If node(s) squeezed" in note and "verify" in note for note in notes)
    assert path.read_bytes() == stored and sorted(tmp_path.iterdir()) == files


def test_a_model_openvino_reads_as_written_is_read_from_its_file(tmp_path: Path) -> None:
    model = pass_through_loop_model()
    isolate_pass_through(model)  # what an exporter writing Identities gives
    path = _saved(model, tmp_path / "ok.onnx")
    ov_model, notes = read_onnx(_ov_core(), path)
    assert notes == [] and ov_model is not None


def test_the_throughput_pool_and_the_layer_profile_read_it_too(tmp_path: Path) -> None:
    path = _saved(pass_through_loop_model(), tmp_path / "loop.onnx")
    pool = open_pool("openvino:cpu", path, {"x": X}, 1)
    try:
        count, _, _ = pool.run_for(0.01)
    finally:
        pool.close()
    assert count >= 1
    profile = profile_layers(path, "openvino:cpu", {"x": X}, runs=1, also_run=[{"x": X}])
    assert profile.layers and any("w_in" in note for note in profile.notes)


def test_validation_passes_on_openvino_and_says_what_it_read(tmp_path: Path) -> None:
    """The validate stage's rows: openvino:cpu within 1e-5 of the reference, before and after simplify (which runs
    onnxoptimizer's eliminate_identity: an Identity written into the artifact would be gone); the execution
    record of what ran names the rewrite."""
    model = pass_through_loop_model()
    onnx.save(model, tmp_path / "model.onnx")
    ctx = context(tmp_path)
    (tmp_path / "s").mkdir()
    result = simplify_model(model, tmp_path / "s", ctx)
    assert "eliminate_identity" in result.findings.passes
    simplified = result.model
    artifacts = {"exported": artifact(tmp_path / "ref.onnx", model),
                 "simplified": artifact(tmp_path / "simple.onnx", simplified, ("export", "simplify"))}
    rows = by_pair(validate.run(artifacts, ["openvino:cpu"], ValidateConfig(samples=2), ctx))
    for variant in artifacts:
        row = rows[(variant, "openvino:cpu")]
        assert row.status == "passed", row
        assert row.metrics.max_abs_err <= 1e-5
        assert any("Identity between" in note for note in row.execution["notes"])


def test_the_package_ir_is_converted_from_the_rewritten_copy(tmp_path: Path) -> None:
    path = _saved(pass_through_loop_model(), tmp_path / "loop.onnx")
    (tmp_path / "package").mkdir()
    written = write_openvino(path, tmp_path / "package", compress_to_fp16=False)
    assert any("w_in" in note for note in written["rewritten"])
    compiled = _ov_core().compile_model(str(tmp_path / "package" / "model.xml"), "CPU",
                                        {"INFERENCE_PRECISION_HINT": "f32"})
    np.testing.assert_allclose(compiled({"x": X})[0], _ort(path), atol=1e-5, rtol=0)
