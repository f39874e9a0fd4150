"""Models whose nodes have no names, or repeat one, go through every transform stage: each output loads in ONNX
Runtime and names every node once (issue 33: int4 weight-only named every nameless MatMul's MatMulNBits "_Q")."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from qdeploy.core.context import StageResult
from qdeploy.stages import export, fp16, quantize, simplify
from qdeploy.stages.export import ExportConfig
from qdeploy.stages.fp16.config import Fp16Config
from qdeploy.stages.quantize import QuantizeConfig
from qdeploy.stages.simplify.config import SimplifyConfig
from tests.helpers.lowering import OV_DOMAIN
from tests.helpers.node_names import nameless_model
from tests.helpers.quantize import save_artifact, stage_context

CASES = {"nameless": [""] * 5, "repeated": ["node"] * 5}
"""Names of the model's five nodes: Conv, Relu, MatMul, Relu, MatMul."""


def _fake_quant_model(names: list[str]) -> onnx.ModelProto:
    """x -> FakeQuantize -> Relu -> FakeQuantize -> y (OpenVINO's op), for mode lower."""
    ranges = [numpy_helper.from_array(np.asarray(value, np.float32), name)
              for name, value in (("lo", -1.0), ("hi", 1.0))]
    nodes = [helper.make_node("FakeQuantize", ["x", "lo", "hi", "lo", "hi"], ["q1"], name=names[0],
                              domain=OV_DOMAIN, levels=256),
             helper.make_node("Relu", ["q1"], ["r"], name=names[1]),
             helper.make_node("FakeQuantize", ["r", "lo", "hi", "lo", "hi"], ["y"], name=names[2],
                              domain=OV_DOMAIN, levels=256)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])], ranges)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(OV_DOMAIN, 1)],
                             ir_version=8)


STEPS: dict[str, tuple[Any, Any]] = {
    "simplify": (simplify, SimplifyConfig()),
    "fp16": (fp16, Fp16Config()),
    "ptq": (quantize, QuantizeConfig(mode="ptq")),
    "dynamic": (quantize, QuantizeConfig(mode="dynamic")),
    "weight_only_int4": (quantize, QuantizeConfig(mode="weight_only", bits=4, group_size=32)),
    "weight_only_int8": (quantize, QuantizeConfig(mode="weight_only", bits=8, group_size=32)),
    "weight_only_int4_dq": (quantize, QuantizeConfig(mode="weight_only", bits=4, group_size=32,
                                                     weight_format="dequantize_linear")),
}


def _assert_named_once_and_loads(result: StageResult) -> None:
    names = [node.name for node in result.model.graph.node]
    assert "" not in names and [n for n, count in Counter(names).items() if count > 1] == [], names
    source = str(result.path) if result.path is not None else result.model.SerializeToString()
    ort.InferenceSession(source, providers=["CPUExecutionProvider"])


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("step", list(STEPS))
def test_each_stage_names_every_node_once(tmp_path: Path, step: str, case: str) -> None:
    """Given the model directly (not through export, which names nodes first), each stage's output is valid."""
    stage, config = STEPS[step]
    result = stage.run(save_artifact(tmp_path, nameless_model(CASES[case])), config, stage_context(tmp_path))
    _assert_named_once_and_loads(result)


@pytest.mark.parametrize("case", list(CASES))
def test_lowering_names_every_node_once(tmp_path: Path, case: str) -> None:
    result = quantize.run(save_artifact(tmp_path, _fake_quant_model(CASES[case][:3])), QuantizeConfig(mode="lower"),
                          stage_context(tmp_path))
    assert {node.op_type for node in result.model.graph.node} == {"QuantizeLinear", "DequantizeLinear", "Relu"}
    _assert_named_once_and_loads(result)


def test_export_names_nodes_once_for_every_later_stage_and_says_so(tmp_path: Path) -> None:
    """A model with repeated names, which ONNX Runtime refuses, is exported with unique names; the finding says
    what was renamed, so the names in the report are explained."""
    onnx.save(nameless_model(["", "", "proj", "act", "proj"]), str(tmp_path / "m.onnx"))
    result = export.run(None, ExportConfig(onnx="m.onnx"), stage_context(tmp_path))
    assert [node.name for node in result.model.graph.node] == ["Conv_c", "Relu_cr", "proj", "act", "proj_2"]
    assert result.findings.to_report()["node_names"] == {
        "unnamed_named": 2, "duplicates_renamed": 1,
        "examples": ["'' (Conv) -> Conv_c", "'' (Relu) -> Relu_cr", "'proj' (MatMul) -> proj_2"]}
    _assert_named_once_and_loads(result)
