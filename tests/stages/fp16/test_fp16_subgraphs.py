"""fp16 on If/Loop/Scan bodies with data: the float16 emulation check runs through the bodies and the artifact
is a valid graph that matches float32."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from qdeploy.core.context import Artifact
from qdeploy.graph.order import scope_problems
from qdeploy.pipeline.recipe.schema import Recipe
from qdeploy.stages.fp16 import Fp16Config, run
from tests.control_flow_models import loop_with_outer_reads_model, lstm_branch_model, nested_constant_if_model


def _scan_sum() -> onnx.ModelProto:
    def vi(name: str) -> onnx.ValueInfoProto:
        return helper.make_tensor_value_info(name, TensorProto.FLOAT, [2])

    body = helper.make_graph([helper.make_node("Add", ["sum_in", "next"], ["sum_out"]),
                              helper.make_node("Identity", ["sum_out"], ["scan_out"])], "body",
                             [vi("sum_in"), vi("next")], [vi("sum_out"), vi("scan_out")])
    node = helper.make_node("Scan", ["initial", "x"], ["y", "z"], num_scan_inputs=1, body=body)
    graph = helper.make_graph([node], "scan", [helper.make_tensor_value_info("initial", TensorProto.FLOAT, [2]),
                                               helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2]),
                               helper.make_tensor_value_info("z", TensorProto.FLOAT, [3, 2])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _feeds(model: onnx.ModelProto, rng: np.random.Generator) -> dict[str, np.ndarray]:
    special = {"sr": np.array(16000, np.int64), "c1": np.array(True), "c2": np.array(False)}
    feeds = {}
    for value in model.graph.input:
        dims = [d.dim_value or 5 for d in value.type.tensor_type.shape.dim]
        feeds[value.name] = special.get(value.name, rng.standard_normal(dims).astype(np.float32))
    return feeds


@pytest.mark.parametrize("make", [_scan_sum, lstm_branch_model, loop_with_outer_reads_model,
                                  nested_constant_if_model])
def test_fp16_with_data_converts_bodies_and_checks_them(make: object, tmp_path: Path) -> None:
    model = make()  # type: ignore[operator]
    path, data = tmp_path / "m.onnx", tmp_path / "data"
    onnx.save(model, path)
    data.mkdir()
    feeds = _feeds(model, np.random.default_rng(0))
    np.savez(data / "s0.npz", **feeds)
    recipe = Recipe(name="t", model={"onnx": str(path)}, variants={"v": []},
                    data={"d": {"reader": "npy", "path": str(data)}})
    ctx = recipe.stage_context("v", tmp_path / "work")
    ctx.work_dir.mkdir()
    artifact = Artifact(path=path, sidecar=tmp_path / "m.json", key="k", sha256="", size_bytes=path.stat().st_size,
                        stages=("export",), parent=None)
    result = run(artifact, Fp16Config(calibration={"data": "d"}), ctx)  # old code: Scan's emulation did not load
    assert result.findings.fidelity["emulated"]["passed"] is True
    onnx.checker.check_model(result.model, full_check=True)
    assert scope_problems(result.model.graph) == []
    got = ort.InferenceSession(result.model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-2, atol=1e-2)
