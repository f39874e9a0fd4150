"""The publishing guard: what ONNX Runtime cannot load, or what changed the interface, is never stored."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import onnx
import pytest
from onnx import TensorProto, helper

from qdeploy.core.context import Artifact, StageContext, StageResult
from qdeploy.core.errors import StageError
from qdeploy.core.findings import Findings
from qdeploy.pipeline.recipe.loader import load_recipe_file
from qdeploy.pipeline.recipe.schema import Recipe
from qdeploy.pipeline.run.guard import guard_artifact
from qdeploy.pipeline.run.runner import RunOptions, run_recipe
from tests.helpers.models import write_recipe


class _Check(Findings):
    """A stage's findings with its own comparison's record (as simplify's ``check``)."""

    check: dict[str, Any]

    def unchecked(self) -> str | None:
        return self.check.get("unchecked")


@pytest.fixture
def ctx(tmp_path: Path) -> StageContext:
    recipe = Recipe(name="t", model={"onnx": "m.onnx"}, variants={"v": []})
    return recipe.stage_context("v", tmp_path / "work")


def _artifact(model: onnx.ModelProto, tmp_path: Path) -> Artifact:
    path = tmp_path / "parent.onnx"
    onnx.save(model, path)
    return Artifact(path=path, sidecar=tmp_path / "parent.json", key="k", sha256="", size_bytes=path.stat().st_size,
                    stages=("export",), parent=None)


def _relu(elem: int = TensorProto.FLOAT) -> onnx.ModelProto:
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", elem, [2])],
                              [helper.make_tensor_value_info("y", elem, [2])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_an_artifact_onnx_runtime_cannot_load_is_refused(tmp_path: Path, ctx: StageContext) -> None:
    broken = _relu()
    broken.graph.node[0].op_type = "NoSuchOp"
    with pytest.raises(StageError, match="does not load in ONNX Runtime"):
        guard_artifact(_artifact(_relu(), tmp_path), StageResult(model=broken), "simplify", ctx)


def test_changed_interface_types_are_refused_except_float16_from_fp16(tmp_path: Path, ctx: StageContext) -> None:
    parent = _artifact(_relu(), tmp_path)
    half = _relu(TensorProto.FLOAT16)
    with pytest.raises(StageError, match=r"'x': tensor\(float\) -> tensor\(float16\)"):
        guard_artifact(parent, StageResult(model=half), "simplify", ctx)
    assert guard_artifact(parent, StageResult(model=half), "fp16", ctx)["checked"] is True


def test_a_graph_out_of_order_because_of_a_subgraph_read_is_put_back_in_order(tmp_path: Path,
                                                                             ctx: StageContext) -> None:
    branch = helper.make_graph([helper.make_node("Neg", ["r"], ["b"])], "b", [],
                               [helper.make_tensor_value_info("b", TensorProto.FLOAT, [2])])
    nodes = [helper.make_node("If", ["c"], ["y"], then_branch=branch, else_branch=branch),
             helper.make_node("Relu", ["x"], ["r"])]  # the If reads r through its branch: it must come after
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2]),
                                           helper.make_tensor_value_info("c", TensorProto.BOOL, [])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    ordered = onnx.ModelProto()
    ordered.CopyFrom(model)
    ordered.graph.node.reverse()
    result = StageResult(model=model)
    verdict = guard_artifact(_artifact(ordered, tmp_path), result, "quantize", ctx)
    assert [node.op_type for node in result.model.graph.node] == ["Relu", "If"]
    assert "reordered" in verdict and result.guard == verdict


def test_a_stage_that_could_not_check_is_reported_unchecked(tmp_path: Path, ctx: StageContext) -> None:
    result = StageResult(model=_relu(), findings=_Check(check={"unchecked": "inputs are sequences"}))
    verdict = guard_artifact(_artifact(_relu(), tmp_path), result, "simplify", ctx)
    assert verdict["checked"] is False and verdict["unchecked"] == "inputs are sequences"


def test_the_runner_publishes_no_unloadable_artifact(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import qdeploy.stages.simplify

    def unloadable(artifact: Artifact, config: object, ctx: StageContext) -> StageResult:
        model = artifact.load()
        model.graph.node[0].op_type = "NoSuchOp"
        return StageResult(model=model, findings=_Check(check={"samples": 3}))

    monkeypatch.setattr(qdeploy.stages.simplify, "run", unloadable)
    onnx.save(_relu(), tmp_path / "m.onnx")
    recipe = write_recipe(tmp_path, """
        name: guarded
        model: {onnx: m.onnx}
        variants:
          fp32: [simplify]
        targets: [ort:cpu]
        benchmark: {batch_sizes: [1], warmup: 1, iterations: 2, rounds: 1}
        """)
    out = tmp_path / "out"
    result = run_recipe(load_recipe_file(recipe), RunOptions(out_dir=out, show_progress=False))
    report = json.loads((out / "report.json").read_text())
    assert result.exit_code != 0
    assert [failure["stage"] for failure in report["failures"]] == ["simplify"]
    assert "does not load in ONNX Runtime" in report["failures"][0]["reason"]
    assert "fp32" not in {artifact["name"] for artifact in report["artifacts"]}


def test_the_report_lists_unchecked_stages_outside_the_details() -> None:
    from qdeploy.pipeline.report.view import highlights

    lines = highlights({"guard": {"checked": False, "unchecked": "inputs are sequences"}, "node_count_after": 3})
    assert lines == ["guard.unchecked: inputs are sequences"]
